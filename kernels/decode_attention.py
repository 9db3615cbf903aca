"""Triton paged decode attention: GQA-packed, split over the context (flash-decoding).

Pass 1, grid (sequence, kv head, split): one program loads the GROUP query heads that share a kv
head as one [GROUP, D] tile, so each key/value row is read from HBM once, and streams its split's
slice of the context. With one split it writes the normalised output directly; otherwise it
writes its partial output and log-sum-exp (base 2) and pass 2, grid (sequence, query head),
merges the splits:

    context  |--- split 0 ---|--- split 1 ---|-- split 2 --|     (chunks of BLOCK_N multiples)
    pass 1   o_0, lse_0       o_1, lse_1      o_2, lse_2
    pass 2   out = sum_j 2^(lse_j - M) o_j / sum_j 2^(lse_j - M),  M = max_j lse_j

Variants (DecodeConfig.variant; DEFAULT_CONFIG picks the engine's):
    TWO_PASS  the above, one block-table load per token
    PAGED     one block-table load per page (BLOCK_N / block_size of them per tile)
    FUSED     PAGED, and no pass 2: each split bumps a per-(sequence, kv head) counter after
              writing its partials; the split that finds it at NUM_SPLITS - 1 merges them
              for its GROUP heads and resets the counter (one launch instead of two)

An fp8 cache (k_scale and v_scale given) takes kernels/decode_attention_fp8.py's pass 1 at
FP8_DEFAULT_CONFIG's launch, then pass 2.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import dataclasses
import enum

import torch
import triton
import triton.language as tl

from .arrival import arrival_counters, reset_arrival
from .decode_attention_fp8 import launch_split_fp8
from .decode_combine import combine_head, decode_reduce_kernel
from .decode_group import softmax_step
from .decode_program import program_sequence
from .fp8_tile import Fp8Convert
from .sinks import sink_start
from .sm_count import num_sms
from .softcap import softcap_log2, softcap_raw

_LOG2E = 1.4426950408889634
_MIN_TOKENS_PER_SPLIT = 128  # below this a split's fixed cost outweighs the parallelism gained
_MAX_SPLITS = 64


class DecodeVariant(enum.Enum):
    """The decode algorithm (see the module doc)."""

    TWO_PASS = "two_pass"
    PAGED = "paged"
    FUSED = "fused"


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the decode kernel; the benchmark sweeps these. An fp8 cache's
    kernel (kernels/decode_attention_fp8.py) ignores `variant`. The split policy fields: see
    choose_num_splits."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    variant: DecodeVariant = DecodeVariant.TWO_PASS
    # split policy: at most programs_per_sm programs per SM (a second, partial wave costs more
    # than the splits gain), at most max_splits per (sequence, kv head), none shorter than
    # min_split tokens. Under graph replay on the H200 (ops/kernel_bench.py, 2026-12-03) 4 per
    # SM was the best split count at every shape from 1 x 4,096 to 256 x 1,024.
    programs_per_sm: int = 4
    max_splits: int = _MAX_SPLITS
    min_split: int = _MIN_TOKENS_PER_SPLIT
    # launch the sequences in the seq_order given (longest first: kernels/decode_order.py);
    # False: in batch order whatever is given
    follow_order: bool = True
    # an fp8 cache: where its tiles become fp16 (kernels/fp8_tile.py)
    fp8_convert: Fp8Convert = Fp8Convert.AT_DOT


# The engine's launch, split policy and algorithm: set to the BEST decode line of
# `python -m troupe.ops.kernel_bench --sweep-variants`.
DEFAULT_CONFIG = DecodeConfig()  # bf16 (and any 16-bit) KV
# fp8 KV (kernels/decode_attention_fp8.py's kernel, converted at the dot): tiles of 64 keys, two
# warps, and two tiles in flight. Its loads are indirect (page ids first), so Triton's pipeliner
# gives them ceil((num_stages - 2) / 2) buffers: 5 stages for two. Chosen for the H200 by
# ops/h200_standin.py (session 46, an H100 with each SM pulling an H200 SM's share of HBM; it
# put the form launched before, 128 keys / 2 warps / 3 stages with one buffer, at 74-76% where
# H200s measured 72-75%): 83% / 84% as H200 at 256x1024 / 16x16384 against that form's 74% /
# 74%; on the whole H100 within 4% of it (2.71 / 2.91 / 2.82 TB/s against 2.81 / 2.88 / 2.77 at
# the three shapes). Splits as the bf16 default (4 programs an SM; the older 3 an SM, splits of
# 256 or more, gave a 16x16384 decode 3 splits: 63% on the H200 against 72%).
FP8_DEFAULT_CONFIG = DecodeConfig(block_n=64, num_warps=2, num_stages=5)


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision for q of `dtype`: exact for fp32 (the fp32 reference mode; Triton
    defaults to TF32 on sm_80+, ~1e-3 relative error on the scores), else Triton's default
    ("tf32", which bf16 and fp16 inputs ignore)."""
    return "ieee" if dtype == torch.float32 else "tf32"


# one compile serves every split count and block-table width (an eager step's varies)
@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,  # [S, Hq, D]: written when not SPLIT, or by the merging split when FUSED
    part_out_ptr,  # [S, Hq, num_splits, D] fp32 when SPLIT
    part_lse_ptr,  # [S, Hq, num_splits] fp32
    counter_ptr,  # int32 [>= S * Hkv], zero between launches, when FUSED
    block_tables_ptr,
    seq_lens_ptr,
    num_valid_ptr,  # int32 [1] when HAS_LIMIT: sequences from this one on are skipped
    order_ptr,  # int32 [S] when HAS_ORDER: the sequences in launch order (decode_order.py)
    sinks_ptr,  # [Hq] when SINKS: each head's sink logit (kernels/sinks.py)
    qk_scale,  # softmax scale * log2(e)
    window,  # sliding window in tokens, 0: none
    cap,  # the scores' soft cap in log2 units when SOFTCAP (kernels/softcap.py)
    num_splits,
    stride_qs,
    stride_qh,
    stride_os,
    stride_oh,
    stride_bt,
    stride_slot,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr,  # num_splits > 1
    PAGED: tl.constexpr,  # block ids per page (BLOCK_N is a multiple of BLOCK_SIZE)
    FUSED: tl.constexpr,  # the last split merges (SPLIT only)
    HAS_LIMIT: tl.constexpr,
    HAS_ORDER: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,  # num_splits rounded up to a power of two (FUSED)
    PRECISION: tl.constexpr,  # tl.dot's input precision (dot_precision)
    SOFTCAP: tl.constexpr,  # scores soft-capped (Gemma 2)
    SINKS: tl.constexpr,  # a learned sink per head, started from by split 0 (GPT-OSS)
):
    seq = program_sequence(order_ptr, HAS_ORDER)  # grid (kv head, position, split)
    kv_head = tl.program_id(0)
    split = tl.program_id(2)
    if HAS_LIMIT:
        if seq >= tl.load(num_valid_ptr):
            return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    # The query sees keys [ctx_start, seq_len): all of them, or the last `window`; nothing
    # before ctx_start is read (a window may have freed those blocks).
    ctx_start = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    # PAGED walks whole pages: from the page holding ctx_start, masking the keys before it.
    lo = ctx_start
    if PAGED:
        lo = (ctx_start // BLOCK_SIZE) * BLOCK_SIZE
    # Per-sequence chunking keeps splits balanced when lengths differ within the batch.
    chunk = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
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
    m_i, l_i = sink_start(sinks_ptr, heads, g_mask & (split == 0), m_i, l_i, SINKS)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    for n in range(start, end, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        if PAGED:
            n_mask &= offs_n >= ctx_start
            PAGES: tl.constexpr = BLOCK_N // BLOCK_SIZE
            offs_p = tl.arange(0, PAGES)
            page_ids = tl.load(
                bt_row + n // BLOCK_SIZE + offs_p, mask=n + offs_p * BLOCK_SIZE < end, other=0
            ).to(tl.int64)
            slots = tl.reshape(
                page_ids[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :], [BLOCK_N]
            )
        else:
            block_ids = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
            slots = block_ids * BLOCK_SIZE + (offs_n % BLOCK_SIZE)
        kv_offs = slots[:, None] * stride_slot + kv_head * HEAD_DIM + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)

        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_G, BLOCK_N]
        if SOFTCAP:
            qk = softcap_raw(qk, qk_scale, cap)
        qk = qk * qk_scale
        m_i, l_i, acc = softmax_step(qk, n_mask, v, m_i, l_i, acc, PRECISION)

    # An empty split (short sequence) leaves l_i = 0, m_i = -inf: it stores o = 0, lse = -inf,
    # which the merge weighs as zero.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc * (1.0 / l_safe)[:, None]
    if not SPLIT:
        o_offs = seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(
            out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :]
        )
    else:
        row = (seq * NUM_Q_HEADS + heads) * num_splits + split  # [BLOCK_G]
        tl.store(
            part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
            o,
            mask=g_mask[:, None] & d_mask[None, :],
        )
        tl.store(part_lse_ptr + row, m_i + tl.log2(l_safe), mask=g_mask)
        if FUSED:
            # every thread's partials are written before the (release) count; the split that
            # counts last reads them all after its (acquire) count
            tl.debug_barrier()
            count_ptr = counter_ptr + seq * NUM_KV_HEADS + kv_head
            done = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
            if done == num_splits - 1:
                tl.debug_barrier()
                for g in tl.static_range(GROUP):
                    head = kv_head * GROUP + g
                    combine_head(
                        part_out_ptr, part_lse_ptr, out_ptr + seq * stride_os + head * stride_oh,
                        (seq * NUM_Q_HEADS + head) * num_splits, num_splits, True,
                        HEAD_DIM, BLOCK_S, BLOCK_D,
                    )  # fmt: skip
                reset_arrival(count_ptr)


def choose_num_splits(
    num_seqs: int,
    num_kv_heads: int,
    max_seq_len: int,
    num_sms: int,
    config: DecodeConfig | None = None,
) -> int:
    """Splits per (sequence, kv head): as many as keep to programs_per_sm programs per SM
    (one wave), but no split shorter than min_split tokens and at most max_splits."""
    cfg = DEFAULT_CONFIG if config is None else config
    programs = num_seqs * num_kv_heads
    wanted = cfg.programs_per_sm * num_sms // programs
    useful = -(-max_seq_len // cfg.min_split)
    return max(1, min(wanted, useful, cfg.max_splits))


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
    seq_order: torch.Tensor | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [S, Hq, D], one query per sequence at its last position; returns [S, Hq, D].

    `seq_order` (device int32 [S], a permutation): the order in which the sequences' programs
    start (kernels/decode_order.py); the result does not depend on it.

    sliding_window > 0: the query sees only the last sliding_window keys (splits cover those).
    softcap > 0: each score is softcap * tanh(score / softcap) (kernels/softcap.py).
    sinks [Hq]: each head's learned sink joins its softmax (kernels/sinks.py).

    `num_valid` (device int32 [1]): only sequences below it are computed, the other rows of
    out are left alone; the grid stays S, so a CUDA graph replays it for any count.
    """
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_q_heads % num_kv_heads == 0, f"Hq={num_q_heads} not a multiple of Hkv={num_kv_heads}"
    assert q.stride(2) == 1, "q's last dim must be contiguous"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous"
    assert sinks is None or sinks.shape == (num_q_heads,), "sinks: one per query head"
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0:
        return out
    fp8 = k_scale is not None
    if config is None:
        config = FP8_DEFAULT_CONFIG if fp8 else DEFAULT_CONFIG
    if not config.follow_order:
        seq_order = None
    if seq_order is not None:
        assert seq_order.shape == (num_seqs,), f"seq_order {tuple(seq_order.shape)}, S={num_seqs}"
    if num_splits is None:
        context = min(max_seq_len, sliding_window) if sliding_window > 0 else max_seq_len
        num_splits = choose_num_splits(num_seqs, num_kv_heads, context, num_sms(q.device), config)
    group = num_q_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    block_s = triton.next_power_of_2(num_splits)
    on_gpu = q.is_cuda
    block_n = config.block_n if on_gpu else 16
    paged = config.variant is not DecodeVariant.TWO_PASS and block_n % block_size == 0
    fused = config.variant is DecodeVariant.FUSED and num_splits > 1
    if num_splits > 1:
        part_out = torch.empty(
            num_seqs, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(
            num_seqs, num_q_heads, num_splits, dtype=torch.float32, device=q.device
        )
    else:
        part_out = part_lse = out  # unused by the kernel
    if k_scale is not None:
        assert v_scale is not None, "an fp8 cache needs k_scale and v_scale"
        fused = False  # pass 2 below merges its splits
        launch_split_fp8(
            q, k_cache, v_cache, out, part_out, part_lse, block_tables, seq_lens,
            num_valid, seq_order, k_scale, v_scale, scale * _LOG2E, sliding_window, num_splits,
            softcap=softcap, sinks=sinks,
            block_n=block_n, block_d=block_d, num_warps=config.num_warps,
            num_stages=config.num_stages if on_gpu else 1, convert=config.fp8_convert,
        )  # fmt: skip
    else:
        counters = arrival_counters(num_seqs * num_kv_heads, q.device) if fused else seq_lens
        _decode_split_kernel[(num_kv_heads, num_seqs, num_splits)](  # decode_order.py
            q,
            k_cache,
            v_cache,
            out,
            part_out,
            part_lse,
            counters,
            block_tables,
            seq_lens,
            seq_lens if num_valid is None else num_valid,
            seq_lens if seq_order is None else seq_order,
            q if sinks is None else sinks,
            scale * _LOG2E,
            sliding_window,
            softcap_log2(softcap),
            num_splits,
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            block_tables.stride(0),
            num_kv_heads * head_dim,
            NUM_Q_HEADS=num_q_heads,
            NUM_KV_HEADS=num_kv_heads,
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=block_size,
            SPLIT=num_splits > 1,
            PAGED=paged,
            FUSED=fused,
            HAS_LIMIT=num_valid is not None,
            HAS_ORDER=seq_order is not None,
            # tl.dot needs at least 16 rows on the GPU; the padded rows are masked off.
            BLOCK_G=max(16, triton.next_power_of_2(group)),
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            BLOCK_S=32 if fused else 1,  # merged 32 splits at a time (one compile for all counts)
            PRECISION=dot_precision(q.dtype),
            SOFTCAP=softcap > 0,
            SINKS=sinks is not None,
            num_warps=config.num_warps,
            num_stages=config.num_stages if on_gpu else 1,
        )
    if num_splits > 1 and not fused:
        decode_reduce_kernel[(num_seqs, num_q_heads)](
            part_out,
            part_lse,
            out,
            seq_lens if num_valid is None else num_valid,
            num_splits,
            out.stride(0),
            out.stride(1),
            NUM_Q_HEADS=num_q_heads,
            HEAD_DIM=head_dim,
            HAS_LIMIT=num_valid is not None,
            BLOCK_S=min(block_s, 64),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out
