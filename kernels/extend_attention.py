"""Triton varlen causal attention whose new keys come from the step's own K/V, not the cache.

A prefill chunk's keys are its sequence's cached prefix (earlier steps' tokens, in the paged
cache) and its own new tokens, whose K and V this step just computed: prepare_qkv leaves the
new tokens' normed, rotated keys in the fused qkv rows (`keep_k`), so they sit in [T, Hkv, D]
views of qkv, one row per token, rows a fixed stride apart. Each program (a tile of BLOCK_Q new
tokens x the GROUP query heads of one kv head, numbered as in kernels/attention_tiles.py) reads

    the prefix   [0, ctx_len)        from the cache through the block table (paged gathers)
    the new keys [0, tok + 1)        from the views: on CUDA (16-bit) through TMA descriptors
                                     (one bulk copy per BLOCK_N rows), elsewhere by pointers

The new keys are the bulk of a prompt's work, and whole tiles of contiguous rows are what the
tensor cores' loads are built for: at 4 x 2,048 new tokens on the H200 (Qwen3-0.6B heads) this
ran at ~420 TFLOP/s against the all-paged kernel's 288 (docs/benchmarks.md, session 33). The
values equal the cache's (the same rounding into the same dtype), so the result is the paged
kernel's up to summation order. An fp8 cache's rows hold x / scale rounded to e4m3 (in q's
dtype, exactly), so the scales fold in as the paged kernel's do. A sliding window splits both
ranges as the paged kernel splits its keys: a masked band from the first row's window start, an
unmasked one that every row sees, the masked diagonal; keys before the window are never read
(their blocks may be freed).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .attention_tiles import find_seq, load_tile_q, store_tile
from .decode_attention import dot_precision, paged_decode_attention_triton
from .paged_attention import _attend
from .prefill_hopper import hopper_prefill_ok, prefill_attention_hopper
from .sinks import sink_start
from .softcap import softcap_log2, softcap_raw

_LOG2E = 1.4426950408889634


@dataclasses.dataclass(frozen=True)
class ExtendConfig:
    """Launch parameters on the GPU: the best eager launch of ops/extend_sweep.py at 4 x 2,048
    (H200, session 36: 348 TFLOP/s eager, 328 graph; 128 / 64 / 4 / 2 gives 341 / 343 and wins
    1-7% on other shapes but spills at 255 registers). Session 33's probe of the new keys alone
    reached 420 with this launch."""

    block_m: int = 64  # rows: BLOCK_Q tokens x BLOCK_G heads
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3  # 16-bit; fp32 tiles take 2 (shared memory), as the paged kernel's


DEFAULT_EXTEND = ExtendConfig()


@triton.jit
def _attend_new(
    acc, m_i, l_i, q, tok, k_desc, v_desc, k_ptr, v_ptr, stride_kt, q_start, kv_col, start,
    end, q_len, qk_scale, window, cap,
    MASKED: tl.constexpr, WINDOWED: tl.constexpr, TMA: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
):  # fmt: skip
    """Online softmax over the sequence's new keys [start, end) (indices among its new tokens);
    MASKED applies the causal mask (row r sees new keys <= tok[r]) and, WINDOWED, the window
    (keys > tok[r] - window) and the band's end. Keys past q_len are the next sequence's rows
    or TMA's zero fill: hidden by the mask, their values zeroed."""
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    for n in tl.range(start, end, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        if TMA:
            k = k_desc.load([q_start + n, kv_col])
        else:
            rows = (q_start + offs_n).to(tl.int64) * stride_kt + kv_col
            kv_mask = (offs_n < q_len)[:, None] & d_mask[None, :]
            k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if SOFTCAP:
            qk = softcap_raw(qk, qk_scale, cap)
        if MASKED:
            visible = offs_n[None, :] <= tok[:, None]
            if WINDOWED:  # a band's last tile may run past its end: those keys are the next's
                visible &= (offs_n[None, :] > tok[:, None] - window) & (offs_n < end)[None, :]
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1) * qk_scale)
        m_use = m_new
        if MASKED and WINDOWED:  # a window can hide a whole tile from a row: no -inf - -inf
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(qk * qk_scale - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if TMA:
            v = v_desc.load([q_start + n, kv_col])
        else:
            v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if MASKED:
            v = tl.where((offs_n < q_len)[:, None], v, 0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def _extend_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_desc, v_desc, k_new_ptr, v_new_ptr, out_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, decode_prefix_ptr, k_scale_ptr,
    v_scale_ptr, sinks_ptr, num_seqs, qk_scale, window, cap,
    stride_qt, stride_qh, stride_kt, stride_ot, stride_oh, stride_bt, stride_slot,
    HAS_PREFIX: tl.constexpr, TMA: tl.constexpr, PAGED: tl.constexpr, WINDOWED: tl.constexpr,
    FP8: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    v_scale = 1.0
    if FP8:  # cache and new rows hold x / scale: k's scale folds into qk's, v's into the output
        qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
        v_scale = tl.load(v_scale_ptr + kv_head)
    seq = find_seq(query_start_loc_ptr, num_seqs, tile, BLOCK_Q)
    if HAS_PREFIX:
        if seq < tl.load(decode_prefix_ptr):
            return
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    num_tiles = tl.cdiv(q_len, BLOCK_Q)
    local = tile - (q_start // BLOCK_Q + seq)
    if local >= num_tiles:
        return
    local = num_tiles - 1 - local  # the tiles that see the most keys start first
    seq = seq.to(tl.int64)
    ctx_len = tl.load(seq_lens_ptr + seq).to(tl.int32) - q_len

    q, tok, tokens, heads, io_mask = load_tile_q(
        q_ptr, q_start, q_len, local, kv_head, stride_qt, stride_qh, GROUP, HEAD_DIM, BLOCK_Q,
        BLOCK_G, BLOCK_D,
    )  # fmt: skip

    m_i = tl.full([BLOCK_Q * BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * BLOCK_G], dtype=tl.float32)
    real = tl.arange(0, BLOCK_Q * BLOCK_G) % BLOCK_G < GROUP
    m_i, l_i = sink_start(sinks_ptr, heads, real, m_i, l_i, SINKS)  # GPT-OSS (kernels/sinks.py)
    acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    q_pos = ctx_len + tok
    full = (ctx_len // BLOCK_N) * BLOCK_N
    first_tok = local * BLOCK_Q
    band = (first_tok // BLOCK_N) * BLOCK_N
    last = tl.minimum(first_tok + BLOCK_Q, q_len)
    kv_col = kv_head * HEAD_DIM
    if WINDOWED:
        # Keys visible to every row run unmasked, as in the paged kernel: from the last row's
        # window start (rounded up to a tile) to the first row's causal edge. The cache part
        # (positions) and the new part (indices among the new tokens) each split in three:
        #   |.. not read ..|-- masked --|---- unmasked ----|-- masked --|
        #   0            first row's  last row's         tiles before
        #                window start window start       the tile's first row
        lo = tl.minimum(tl.maximum(ctx_len + first_tok - window + 1, 0), ctx_len)
        c_start = tl.maximum(full, lo)
        shared = tl.cdiv(tl.maximum(ctx_len + last - window, 0), BLOCK_N) * BLOCK_N
        b_start = tl.minimum(tl.maximum(shared, lo), c_start)
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, kv_head, lo, b_start,
            stride_slot, qk_scale, window, cap, True, False, True, False, False, HEAD_DIM,
            BLOCK_SIZE, BLOCK_N, BLOCK_D, PRECISION, SOFTCAP,
        )  # fmt: skip
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, kv_head, b_start,
            c_start, stride_slot, qk_scale, window, cap, False, False, True, False, False, HEAD_DIM,
            BLOCK_SIZE, BLOCK_N, BLOCK_D, PRECISION, SOFTCAP,
        )  # fmt: skip
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, kv_head, c_start,
            ctx_len, stride_slot, qk_scale, window, cap, True, False, True, False, False, HEAD_DIM,
            BLOCK_SIZE, BLOCK_N, BLOCK_D, PRECISION, SOFTCAP,
        )  # fmt: skip
        lo = tl.maximum(first_tok - window + 1, 0)
        c_start = tl.maximum(band, lo)
        shared = tl.cdiv(tl.maximum(last - window, 0), BLOCK_N) * BLOCK_N
        b_start = tl.minimum(tl.maximum(shared, lo), c_start)
        acc, m_i, l_i = _attend_new(
            acc, m_i, l_i, q, tok, k_desc, v_desc, k_new_ptr, v_new_ptr, stride_kt, q_start,
            kv_col, lo, b_start, q_len, qk_scale, window, cap, True, True, TMA, BLOCK_N, BLOCK_D,
            HEAD_DIM, PRECISION, SOFTCAP,
        )  # fmt: skip
        acc, m_i, l_i = _attend_new(
            acc, m_i, l_i, q, tok, k_desc, v_desc, k_new_ptr, v_new_ptr, stride_kt, q_start,
            kv_col, b_start, c_start, q_len, qk_scale, window, cap, False, True, TMA, BLOCK_N,
            BLOCK_D, HEAD_DIM, PRECISION, SOFTCAP,
        )  # fmt: skip
        acc, m_i, l_i = _attend_new(
            acc, m_i, l_i, q, tok, k_desc, v_desc, k_new_ptr, v_new_ptr, stride_kt, q_start,
            kv_col, c_start, last, q_len, qk_scale, window, cap, True, True, TMA, BLOCK_N, BLOCK_D,
            HEAD_DIM, PRECISION, SOFTCAP,
        )  # fmt: skip
    else:
        # The cached prefix: every row sees all of it; whole BLOCK_N tiles unmasked, the
        # partial last one masked to ctx_len (a position past every key: q_pos >= ctx_len).
        big = 1 << 30
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, kv_head, 0, full,
            stride_slot, qk_scale, big, cap, False, PAGED, True, False, False, HEAD_DIM, BLOCK_SIZE,
            BLOCK_N, BLOCK_D, PRECISION, SOFTCAP,
        )  # fmt: skip
        acc, m_i, l_i = _attend(
            acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, kv_head, full, ctx_len,
            stride_slot, qk_scale, big, cap, True, PAGED, True, False, False, HEAD_DIM, BLOCK_SIZE,
            BLOCK_N, BLOCK_D, PRECISION, SOFTCAP,
        )  # fmt: skip
        # The new keys: those before the tile's first token unmasked, the diagonal masked.
        acc, m_i, l_i = _attend_new(
            acc, m_i, l_i, q, tok, k_desc, v_desc, k_new_ptr, v_new_ptr, stride_kt, q_start,
            kv_col, 0, band, q_len, qk_scale, 0, cap, False, False, TMA, BLOCK_N, BLOCK_D, HEAD_DIM,
            PRECISION, SOFTCAP,
        )  # fmt: skip
        acc, m_i, l_i = _attend_new(
            acc, m_i, l_i, q, tok, k_desc, v_desc, k_new_ptr, v_new_ptr, stride_kt, q_start,
            kv_col, band, last, q_len, qk_scale, 0, cap, True, False, TMA, BLOCK_N, BLOCK_D,
            HEAD_DIM, PRECISION, SOFTCAP,
        )  # fmt: skip
    # Every valid row sees itself, so l_i > 0 there; padded rows are not stored.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    if FP8:
        out = acc * (v_scale / l_safe)[:, None]
    else:
        out = acc / l_safe[:, None]
    store_tile(out_ptr, out, tokens, heads, io_mask, stride_ot, stride_oh, BLOCK_D)


def _tma_ok(t: torch.Tensor, head_dim: int) -> bool:
    """A [T, Hkv, D] view TMA can describe as 2-D rows: 16-bit values (the form measured;
    fp32 keeps pointer loads), 16-byte aligned base and row stride, D a power of two."""
    size = t.element_size()
    return (
        t.is_cuda
        and size == 2
        and t.stride(2) == 1
        and t.stride(1) == head_dim
        and t.data_ptr() % 16 == 0
        and (t.stride(0) * size) % 16 == 0
        and head_dim == triton.next_power_of_2(head_dim)
        and head_dim * size >= 16
    )


def extend_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    new_kv: tuple[torch.Tensor, torch.Tensor],
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_seq_len: int,
    decode_prefix: torch.Tensor | None = None,
    *,
    sliding_window: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    config: ExtendConfig = DEFAULT_EXTEND,
    out: torch.Tensor | None = None,
    tma: bool | None = None,
    hopper: bool | None = None,
) -> torch.Tensor:
    """paged_attention_triton's contract with the step's new tokens' K and V also in new_kv
    ([T, Hkv, D] each, rows as q's, q's dtype, holding what the cache holds: for an fp8 cache
    x / scale rounded to e4m3, as prepare_qkv's keep_k leaves them). decode_prefix's sequences
    go to the decode kernel, which reads the cache. tma: None takes TMA where the views allow
    it on CUDA; hopper: None takes kernels/prefill_hopper.py where it applies (sm_90, bf16,
    head_dim 128, no window, fp8, soft cap or sinks); the kernel tests force either form."""
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    k_new, v_new = new_kv
    assert k_new.shape == v_new.shape == (num_tokens, num_kv_heads, head_dim), (
        f"new_kv {tuple(k_new.shape)} / {tuple(v_new.shape)}, expected "
        f"{(num_tokens, num_kv_heads, head_dim)}"
    )
    assert k_new.stride() == v_new.stride() and k_new.stride(2) == 1, "new_kv: rows alike"
    assert k_new.dtype == q.dtype, "new_kv holds the cache's values in q's dtype"
    assert (k_scale is None) == (v_scale is None), "fp8: both scales or none"
    out = torch.empty_like(q) if out is None else out
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    if decode_prefix is not None:
        paged_decode_attention_triton(
            q[:num_seqs], k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len,
            out=out[:num_seqs], num_valid=decode_prefix, sliding_window=sliding_window,
            k_scale=k_scale, v_scale=v_scale, seq_order=seq_order, softcap=softcap, sinks=sinks,
        )  # fmt: skip
    if hopper is None:
        hopper = (
            softcap == 0
            and sinks is None
            and hopper_prefill_ok(q, k_cache, new_kv, sliding_window, k_scale is not None)
        )
    if hopper:
        assert softcap == 0 and sinks is None, "the Hopper prefill has no soft cap or sinks"
        return prefill_attention_hopper(
            q, k_cache, v_cache, new_kv, block_tables, seq_lens, query_start_loc, scale, out,
            decode_prefix,
        )  # fmt: skip
    group = num_q_heads // num_kv_heads
    block_g = triton.next_power_of_2(group)
    on_gpu = q.is_cuda
    block_m = config.block_m if on_gpu else 16
    block_q = max(1, block_m // block_g)
    block_n = config.block_n if on_gpu else 16
    if tma is None:
        tma = _tma_ok(k_new, head_dim) and _tma_ok(v_new, head_dim)
    k_desc: TensorDescriptor | torch.Tensor = k_new
    v_desc: TensorDescriptor | torch.Tensor = v_new
    if tma:
        width = num_kv_heads * head_dim
        row = k_new.stride(0)
        k_desc = TensorDescriptor(k_new, [num_tokens, width], [row, 1], [block_n, head_dim])
        v_desc = TensorDescriptor(v_new, [num_tokens, width], [row, 1], [block_n, head_dim])
    grid = (num_tokens // block_q + num_seqs + 1, num_kv_heads)
    _extend_kernel[grid](
        q, k_cache, v_cache, k_desc, v_desc, k_new, v_new, out, block_tables, seq_lens,
        query_start_loc, seq_lens if decode_prefix is None else decode_prefix,
        seq_lens if k_scale is None else k_scale,  # unused unless FP8
        seq_lens if v_scale is None else v_scale, q if sinks is None else sinks, num_seqs,
        scale * _LOG2E, sliding_window,
        softcap_log2(softcap), q.stride(0), q.stride(1), k_new.stride(0), out.stride(0),
        out.stride(1), block_tables.stride(0), num_kv_heads * head_dim,
        HAS_PREFIX=decode_prefix is not None, TMA=tma, PAGED=block_n % block_size == 0,
        WINDOWED=sliding_window > 0, FP8=k_scale is not None, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_G=block_g, BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim), PRECISION=dot_precision(q.dtype),
        SOFTCAP=softcap > 0, SINKS=sinks is not None, num_warps=config.num_warps if on_gpu else 4,
        num_stages=(config.num_stages if q.element_size() == 2 else 2) if on_gpu else 1,
    )  # fmt: skip
    return out
