"""Triton paged decode attention: GQA-packed, split over the context (flash-decoding).

Pass 1, grid (sequence, kv head, split): one program loads the GROUP query heads that share a kv
head as one [GROUP, D] tile, so each key/value row is read from HBM once, and streams its split's
slice of the context. With one split it writes the normalised output directly; otherwise it
writes its partial output and log-sum-exp (base 2) and pass 2, grid (sequence, query head),
merges the splits:

    context  |--- split 0 ---|--- split 1 ---|-- split 2 --|     (chunks of BLOCK_N multiples)
    pass 1   o_0, lse_0       o_1, lse_1      o_2, lse_2
    pass 2   out = sum_j 2^(lse_j - M) o_j / sum_j 2^(lse_j - M),  M = max_j lse_j
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .decode_attention_fp8 import Fp8Variant, decode_split_fp8_kernel, fp8_modes

_LOG2E = 1.4426950408889634
_MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost outweighs the parallelism gained
_MAX_SPLITS = 32


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the decode kernel; the benchmark sweeps these. `fp8` picks the
    kernel variant for an fp8 cache (kernels/decode_attention_fp8.py); bf16 ignores it.
    `min_split_tokens` / `split_waves`: see choose_num_splits."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    fp8: Fp8Variant = Fp8Variant.BF16_DOT
    min_split_tokens: int = _MIN_TOKENS_PER_SPLIT
    split_waves: int = 2


DEFAULT_CONFIG = DecodeConfig()  # bf16 (and any 16-bit) KV
# fp8 KV: the winner of `python -m troupe.ops.fp8_kv_bench attention --sweep-variants` goes here
FP8_DEFAULT_CONFIG = DecodeConfig()


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,  # [S, Hq, D] when NUM_SPLITS == 1
    part_out_ptr,  # [S, Hq, NUM_SPLITS, D] fp32 otherwise
    part_lse_ptr,  # [S, Hq, NUM_SPLITS] fp32
    block_tables_ptr,
    seq_lens_ptr,
    num_valid_ptr,  # int32 [1] when HAS_LIMIT: sequences from this one on are skipped
    k_scale_ptr,  # [Hkv] fp32 when FP8: folded into qk_scale and the output
    v_scale_ptr,
    qk_scale,  # softmax scale * log2(e)
    window,  # sliding window in tokens, 0: none
    stride_qs,
    stride_qh,
    stride_os,
    stride_oh,
    stride_bt,
    stride_slot,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_LIMIT: tl.constexpr,
    FP8: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    v_scale = 1.0
    if FP8:
        qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
        v_scale = tl.load(v_scale_ptr + kv_head)
    if HAS_LIMIT:
        if seq >= tl.load(num_valid_ptr):
            return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    # The query sees keys [ctx_start, seq_len): all of them, or the last `window`; nothing
    # before ctx_start is read (a window may have freed those blocks).
    ctx_start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    # Per-sequence chunking keeps splits balanced when lengths differ within the batch.
    chunk = tl.cdiv(tl.cdiv(seq_len - ctx_start, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = ctx_start + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g
    q_offs = seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    for n in range(start, end, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        block_ids = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slots = block_ids * BLOCK_SIZE + (offs_n % BLOCK_SIZE)
        kv_offs = slots[:, None] * stride_slot + kv_head * HEAD_DIM + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)

        qk = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_G, BLOCK_N]
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # An empty split (short sequence) leaves l_i = 0, m_i = -inf: it stores o = 0, lse = -inf,
    # which pass 2 weighs as zero.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc * (v_scale / l_safe)[:, None]
    if NUM_SPLITS == 1:
        o_offs = seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(
            out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :]
        )
    else:
        row = (seq * NUM_Q_HEADS + heads) * NUM_SPLITS + split  # [BLOCK_G]
        tl.store(
            part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
            o,
            mask=g_mask[:, None] & d_mask[None, :],
        )
        tl.store(part_lse_ptr + row, m_i + tl.log2(l_safe), mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_valid_ptr,
    stride_os,
    stride_oh,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_LIMIT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if HAS_LIMIT:
        if seq >= tl.load(num_valid_ptr):
            return
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    d_mask = offs_d < HEAD_DIM
    base = (seq * NUM_Q_HEADS + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + base + offs_s, mask=s_mask, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, axis=0))  # split 0 is never empty: the max is finite
    o = tl.load(
        part_out_ptr + (base + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    out = tl.sum(o * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def choose_num_splits(
    num_seqs: int,
    num_kv_heads: int,
    max_seq_len: int,
    num_sms: int,
    min_split_tokens: int = _MIN_TOKENS_PER_SPLIT,
    waves: int = 2,
) -> int:
    """Splits per (sequence, kv head): enough programs to fill every SM `waves` times over, but
    no split shorter than `min_split_tokens` tokens."""
    programs = num_seqs * num_kv_heads
    wanted = -(-waves * num_sms // programs)  # ceil division
    useful = -(-max_seq_len // min_split_tokens)
    return max(1, min(wanted, useful, _MAX_SPLITS))


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: a few splits so the tests exercise the reduction
    return torch.cuda.get_device_properties(device).multi_processor_count


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_seq_len: int,
    *,
    num_splits: int | None = None,
    config: DecodeConfig | None = None,
    out: torch.Tensor | None = None,
    num_valid: torch.Tensor | None = None,
    sliding_window: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [S, Hq, D], one query per sequence at its last position; returns [S, Hq, D].

    sliding_window > 0: the query sees only the last sliding_window keys (splits cover those).

    `num_valid` (device int32 [1]): only sequences below it are computed, the other rows of
    out are left alone; the grid stays S, so a CUDA graph replays it for any count.
    """
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_q_heads % num_kv_heads == 0, f"Hq={num_q_heads} not a multiple of Hkv={num_kv_heads}"
    assert q.stride(2) == 1, "q's last dim must be contiguous"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous"
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0:
        return out
    fp8 = k_scale is not None
    if config is None:
        config = FP8_DEFAULT_CONFIG if fp8 else DEFAULT_CONFIG
    if num_splits is None:
        context = min(max_seq_len, sliding_window) if sliding_window > 0 else max_seq_len
        num_splits = choose_num_splits(
            num_seqs, num_kv_heads, context, _num_sms(q.device),
            config.min_split_tokens, config.split_waves,
        )  # fmt: skip
    group = num_q_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    if num_splits > 1:
        part_out = torch.empty(
            num_seqs, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(
            num_seqs, num_q_heads, num_splits, dtype=torch.float32, device=q.device
        )
    else:
        part_out = part_lse = out  # unused by the kernel
    on_gpu = q.is_cuda
    if fp8 and config.fp8 is not Fp8Variant.BF16_DOT:
        k_mode, v_mode, prefetch = fp8_modes(config.fp8)
        kernel, variant_args = decode_split_fp8_kernel, {
            "K_MODE": k_mode, "V_MODE": v_mode, "PREFETCH": prefetch,
        }  # fmt: skip
    else:
        kernel, variant_args = _decode_split_kernel, {"FP8": fp8}
    kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        out,
        part_out,
        part_lse,
        block_tables,
        seq_lens,
        seq_lens if num_valid is None else num_valid,
        seq_lens if k_scale is None else k_scale,  # unused unless FP8
        seq_lens if v_scale is None else v_scale,
        scale * _LOG2E,
        sliding_window,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        num_kv_heads * head_dim,
        NUM_Q_HEADS=num_q_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        NUM_SPLITS=num_splits,
        HAS_LIMIT=num_valid is not None,
        # tl.dot needs at least 16 rows on the GPU; the padded rows are masked off.
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=config.block_n if on_gpu else 16,
        BLOCK_D=block_d,
        num_warps=config.num_warps,
        num_stages=config.num_stages if on_gpu else 1,
        **variant_args,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_q_heads)](
            part_out,
            part_lse,
            out,
            seq_lens if num_valid is None else num_valid,
            out.stride(0),
            out.stride(1),
            NUM_Q_HEADS=num_q_heads,
            HEAD_DIM=head_dim,
            NUM_SPLITS=num_splits,
            HAS_LIMIT=num_valid is not None,
            BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out
