"""Triton varlen paged attention: prefill, chunked prefill and mixed steps, over a flat tile grid.

Grid: (query tile, kv head), the flat tile grid of kernels/attention_tiles.py (GQA-packed
tiles, numbered without a host-side table, sized by tensor shapes only, so a CUDA graph
captured for a token count replays any mix of sequences padded to it).

With `decode_prefix` (a device int32 [1]: the first N sequences are one-token decodes), those
rows go to the decode kernel instead (GQA-packed, split over the context), which reads long
contexts at copy bandwidth, and the tile kernel skips them; a graph replays both launches.

Token t of a sequence lives at block_tables[s, t // block_size] * block_size + t % block_size
(a cache "slot"), and query i of the sequence sits at position seq_len - q_len + i.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import dataclasses
import enum

import torch
import triton
import triton.language as tl

from .attention_tiles import find_seq, load_tile_q, store_tile
from .decode_attention import dot_precision, paged_decode_attention_triton
from .sinks import sink_start
from .softcap import softcap_log2, softcap_raw

_LOG2E = 1.4426950408889634


class PrefillVariant(enum.Enum):
    """The tile loop's algorithm. BASE: a block-table load per key, qk scaled by a multiply.
    PAGED: a block-table load per page (unwindowed only), the scale folded into exp2's FMA.
    LAZY: PAGED, and acc/l rescaled only when some row's max grows by more than 8 (log2).
    WS: PAGED, and the unmasked band's loop warp-specialized (tl.range(warp_specialize=True))."""

    BASE = "base"
    PAGED = "paged"
    LAZY = "lazy"
    WS = "ws"


@dataclasses.dataclass(frozen=True)
class PrefillConfig:
    """Launch parameters of the tile kernel on the GPU; the benchmark sweeps these."""

    # best of kernel_bench --sweep at 4 x 2,048 on the H200 (2026-12-01); 64 rows also give a
    # lone prefill chunk twice the programs of 128
    block_m: int = 64  # rows: BLOCK_Q tokens x BLOCK_G heads
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    variant: PrefillVariant = PrefillVariant.BASE


# The engine's launch and algorithm: set to the BEST line of
# `python -m troupe.ops.kernel_bench --sweep-variants` (4 x 2,048 new tokens).
# H200, 2026-12-02: PAGED 286 TFLOP/s at 4 x 2,048 vs BASE 237 in the same sweep (docs/benchmarks.md)
DEFAULT_CONFIG = PrefillConfig(variant=PrefillVariant.PAGED)


@triton.jit
def _attend(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    k_cache_ptr,
    v_cache_ptr,
    bt_row,
    kv_head,
    start,
    end,
    stride_slot,
    qk_scale,
    window,  # keys older than q_pos - window are hidden (a huge number when unwindowed)
    cap,  # the scores' soft cap in log2 units when SOFTCAP (kernels/softcap.py)
    MASKED: tl.constexpr,
    PAGED: tl.constexpr,  # one block-table load per page (start page-aligned, no window)
    FOLD: tl.constexpr,  # the scale folded into exp2's argument (an FMA) instead of a multiply
    LAZY: tl.constexpr,  # FOLD, and acc rescaled only when a row max grows by more than 8
    WS: tl.constexpr,  # Triton's warp specialization of the loop (load warps, math warps)
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot's input precision (decode_attention.dot_precision)
    SOFTCAP: tl.constexpr,  # scores soft-capped (Gemma 2)
):
    """Online softmax over keys [start, end); MASKED applies the causal, window and length
    masks. Nothing before start is read: a window may have freed those blocks. m_i is in scaled
    (log2) units whatever the flags."""
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    for n in tl.range(start, end, BLOCK_N, warp_specialize=WS):
        offs_n = n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        if PAGED:
            offs_p = tl.arange(0, BLOCK_N // BLOCK_SIZE)
            p_mask = n + offs_p * BLOCK_SIZE < end
            page_ids = tl.load(bt_row + n // BLOCK_SIZE + offs_p, mask=p_mask, other=0)
            slots = tl.reshape(
                page_ids.to(tl.int64)[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :],
                [BLOCK_N],
            )
        else:
            block_ids = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
            slots = block_ids * BLOCK_SIZE + (offs_n % BLOCK_SIZE)
        kv_offs = slots[:, None] * stride_slot + kv_head * HEAD_DIM + offs_d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        # fp8 caches: the scales are folded into qk_scale and the output, so KV is only cast
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if SOFTCAP:
            qk = softcap_raw(qk, qk_scale, cap)
        if not FOLD:
            qk = qk * qk_scale
        if MASKED:
            visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
            visible &= offs_n[None, :] > q_pos[:, None] - window
            qk = tl.where(visible, qk, float("-inf"))
        if FOLD:
            m_new = tl.maximum(m_i, tl.max(qk, axis=1) * qk_scale)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        if LAZY:
            # keep the old max unless some row's grew by more than 8 (p stays below 2^8)
            grow = m_new - tl.maximum(m_i, -1e30)  # no -inf - -inf (NaN)
            if tl.max(grow, axis=0) > 8.0:
                m_use = m_new
                if MASKED:
                    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_use)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
                m_i = m_new
            m_use = m_i
            if MASKED:
                m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
            p = tl.exp2(qk * qk_scale - m_use[:, None])
            l_i = l_i + tl.sum(p, axis=1)
            acc = acc + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        else:
            m_use = m_new
            if MASKED:  # a window can hide a whole tile from a row: -inf - -inf would be NaN
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            if FOLD:
                p = tl.exp2(qk * qk_scale - m_use[:, None])
            else:
                p = tl.exp2(qk - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
    return acc, m_i, l_i


# An eager step (past the mixed graphs' token counts) has any sequence count and block-table
# width: specialized on them (== 1, % 16), its first steps compiled up to three variants, ~1.5 s
# each (docs/benchmarks.md, session 28); nothing in the kernel gains from knowing them.
@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    decode_prefix_ptr,  # int32 [1] when HAS_PREFIX: these leading sequences are skipped
    k_scale_ptr,  # [Hkv] fp32 when FP8
    v_scale_ptr,
    sinks_ptr,  # [Hq] when SINKS: each head's sink logit (kernels/sinks.py)
    num_seqs,
    qk_scale,  # softmax scale * log2(e)
    window,  # sliding window in tokens, 0: none
    cap,  # the scores' soft cap in log2 units when SOFTCAP (kernels/softcap.py)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_slot,  # cache elements between consecutive slots: Hkv * D
    HAS_PREFIX: tl.constexpr,
    FP8: tl.constexpr,
    PAGED: tl.constexpr,
    FOLD: tl.constexpr,
    LAZY: tl.constexpr,
    WS: tl.constexpr,  # warp-specialize the unmasked band's loop
    GROUP: tl.constexpr,  # query heads per kv head
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per KV block
    BLOCK_Q: tl.constexpr,  # tokens per tile
    BLOCK_G: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,  # scores soft-capped (Gemma 2)
    SINKS: tl.constexpr,  # a learned sink per head (GPT-OSS)
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    v_scale = 1.0
    if FP8:
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
    # Programs start in grid order: give the first ones the last tiles, which see the most keys
    # (causal), so the long programs do not all end up in the last wave.
    local = num_tiles - 1 - local
    seq = seq.to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    ctx_len = seq_len - q_len

    q, tok, tokens, heads, io_mask = load_tile_q(
        q_ptr, q_start, q_len, local, kv_head, stride_qt, stride_qh, GROUP, HEAD_DIM, BLOCK_Q,
        BLOCK_G, BLOCK_D,
    )  # fmt: skip
    q_pos = ctx_len + tok

    m_i = tl.full([BLOCK_Q * BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * BLOCK_G], dtype=tl.float32)
    real = tl.arange(0, BLOCK_Q * BLOCK_G) % BLOCK_G < GROUP
    m_i, l_i = sink_start(sinks_ptr, heads, real, m_i, l_i, SINKS)
    acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq * stride_bt
    # Keys before the tile's first query are visible to every row (causal) and, windowed, so
    # are keys from the last row's window start on: that band runs unmasked. Keys past the last
    # query are never visible (causal), keys before the first row's window start neither:
    #
    #   keys  |... not read ...|-- A masked --|---- B unmasked ----|-- C masked --|
    #         0              win_lo        b_start              c_start        kv_end
    first_q = ctx_len + local * BLOCK_Q
    full_end = (first_q // BLOCK_N) * BLOCK_N
    kv_end = tl.minimum(first_q + BLOCK_Q, seq_len)
    windowed = window > 0
    win = tl.where(windowed, window, 1 << 30)
    win_lo = tl.where(windowed, tl.maximum(first_q - window + 1, 0), 0)
    full_lo = tl.where(windowed, tl.maximum(kv_end - window, 0), 0)  # row kv_end - 1's start
    c_start = tl.maximum(full_end, win_lo)
    b_start = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, win_lo), c_start)
    acc, m_i, l_i = _attend(
        acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, kv_head, win_lo, b_start,
        stride_slot, qk_scale, win, cap, True, PAGED, FOLD, LAZY, False, HEAD_DIM, BLOCK_SIZE,
        BLOCK_N, BLOCK_D, PRECISION, SOFTCAP,
    )  # fmt: skip
    acc, m_i, l_i = _attend(
        acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, kv_head, b_start, c_start,
        stride_slot, qk_scale, win, cap, False, PAGED, FOLD, LAZY, WS, HEAD_DIM, BLOCK_SIZE,
        BLOCK_N, BLOCK_D, PRECISION, SOFTCAP,
    )  # fmt: skip
    acc, m_i, l_i = _attend(
        acc, m_i, l_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, kv_head, c_start, kv_end,
        stride_slot, qk_scale, win, cap, True, PAGED, FOLD, LAZY, False, HEAD_DIM, BLOCK_SIZE,
        BLOCK_N, BLOCK_D, PRECISION, SOFTCAP,
    )  # fmt: skip
    # Every valid row sees itself, so l_i > 0 there; padded rows are not stored.
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc * (v_scale / l_safe)[:, None]
    store_tile(out_ptr, out, tokens, heads, io_mask, stride_ot, stride_oh, BLOCK_D)


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    decode_prefix: torch.Tensor | None = None,
    *,
    sliding_window: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    config: PrefillConfig = DEFAULT_CONFIG,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen causal attention of q [T, Hq, D] over the paged cache; returns [T, Hq, D]
    (written into out when given). See the module doc for `decode_prefix`; sliding_window > 0
    hides keys older than the last sliding_window positions of each query (HF's mask);
    softcap > 0 caps the scores (kernels/softcap.py); sinks [Hq] join the softmax
    (kernels/sinks.py)."""
    del max_query_len  # the grid depends on shapes only, so a CUDA graph can replay it
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_q_heads % num_kv_heads == 0, f"Hq={num_q_heads} not a multiple of Hkv={num_kv_heads}"
    assert q.stride(2) == 1, "q's last dim must be contiguous"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous"
    out = torch.empty_like(q) if out is None else out
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    if decode_prefix is not None:
        # rows 0..S-1 hold the decodes of sequences 0..N-1 (one token each come first); the
        # decode kernel's programs past N return at once
        paged_decode_attention_triton(
            q[:num_seqs],
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            scale,
            max_seq_len,
            out=out[:num_seqs],
            num_valid=decode_prefix,
            sliding_window=sliding_window,
            k_scale=k_scale,
            v_scale=v_scale,
            seq_order=seq_order,
            softcap=softcap,
            sinks=sinks,
        )
    group = num_q_heads // num_kv_heads
    block_g = triton.next_power_of_2(group)
    on_gpu = q.is_cuda
    block_m = config.block_m if on_gpu else 16
    block_q = max(1, block_m // block_g)
    block_n = config.block_n if on_gpu else 16
    fold = config.variant is not PrefillVariant.BASE
    grid = (num_tokens // block_q + num_seqs + 1, num_kv_heads)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_lens,
        query_start_loc,
        seq_lens if decode_prefix is None else decode_prefix,
        seq_lens if k_scale is None else k_scale,  # unused unless FP8
        seq_lens if v_scale is None else v_scale,
        q if sinks is None else sinks,
        num_seqs,
        scale * _LOG2E,
        sliding_window,
        softcap_log2(softcap),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        num_kv_heads * head_dim,
        HAS_PREFIX=decode_prefix is not None,
        FP8=k_scale is not None,
        PAGED=fold and sliding_window == 0 and block_n % block_size == 0,
        FOLD=fold,
        LAZY=config.variant is PrefillVariant.LAZY,
        WS=config.variant is PrefillVariant.WS,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_G=block_g,
        BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        PRECISION=dot_precision(q.dtype),
        SOFTCAP=softcap > 0,
        SINKS=sinks is not None,
        num_warps=config.num_warps if on_gpu else 4,
        num_stages=config.num_stages if on_gpu else 1,
    )
    return out
