"""MLA decode pass 1, heads as rows, one cache page per step through TMA (MlaVariant.TMA).

A page of the latent cache is BLOCK_SIZE consecutive rows of [c | k_r] (slot = block *
block_size + offset), so one block id addresses a [BLOCK_SIZE, 576] box. This kernel walks the
split one page at a time and loads each full page with Hopper's tensor memory accelerator
(tensor descriptors over the cache as [slots, L + R]): no per-row address math and no
per-thread load instructions, the copies asynchronous (the pipeliner stages them over
num_stages). A TMA box is at most 256 wide, so the latent part comes as two [BLOCK_SIZE, 256]
pieces (c_lo, c_hi; one piece for L <= 256), the rope part as [BLOCK_SIZE, BLOCK_R]; the scores
sum three products (transposed: see _page_step) and the output is two [BLOCK_H, 256]
accumulators. MlaLaunch.ids_ahead
loads the next page's id one step early. The split's last page, when the context ends inside
it, is read with masked loads instead (rows past the context are never read: they may hold
anything). Splits, partials and the fused merge (kernels/mla_split_merge.merge_if_last_rolled)
are those of the other pass-1 kernels; MlaLaunch.block_n is not used (a step is a page).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .mla_split_merge import merge_if_last_rolled

MAX_BOX = 256  # a TMA box's widest dimension


@triton.jit
def _page_step(q_lo, q_hi, qr, c_lo, c_hi, kr, p_mask, m, denom, acc_lo, acc_hi, qk_scale,
               TWO: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """The online-softmax update for one page's rows. The scores are computed transposed
    (rows [page, H] = c @ q^T, the queries given transposed), so the page's tiles are the A
    operand of the score products and the B operand of P @ c as they lie in shared memory
    (transposing a [16, 256] tile in registers cost ~250 registers with spills, sm_90)."""
    s_t = tl.dot(c_lo, q_lo, input_precision=PRECISION)
    if TWO:
        s_t += tl.dot(c_hi, q_hi, input_precision=PRECISION)
    s_t += tl.dot(kr, qr, input_precision=PRECISION)
    s = tl.where(p_mask[None, :], tl.trans(s_t) * qk_scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m - m_new)
    denom = denom * alpha + tl.sum(p, axis=1)
    pb = p.to(c_lo.dtype)
    acc_lo = acc_lo * alpha[:, None] + tl.dot(pb, c_lo, input_precision=PRECISION)
    if TWO:
        acc_hi = acc_hi * alpha[:, None] + tl.dot(pb, c_hi, input_precision=PRECISION)
    return m_new, denom, acc_lo, acc_hi


@triton.jit
def mla_split_tma_kernel(
    q_lat_ptr,  # [T, H, L]
    q_rope_ptr,  # [T, H, R]
    c_desc,  # the cache as [slots, L + R], box [BLOCK_SIZE, PIECE]
    r_desc,  # the same, box [BLOCK_SIZE, BLOCK_R]
    cache_ptr,  # [slots, L + R] (the partial last page)
    out_ptr,  # [T, H, L] when NUM_SPLITS == 1
    part_out_ptr,  # [T, H, NUM_SPLITS, L] otherwise (fp32, or the output dtype)
    part_lse_ptr,  # [T, H, NUM_SPLITS] fp32
    block_tables_ptr,
    row_seq_ptr,  # [T] int32: the sequence of each row
    row_ctx_ptr,  # [T] int32: tokens the row sees (0: padding row)
    counter_ptr,  # [T * head blocks] int32 arrival counters (FUSED_MERGE)
    qk_scale,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_rt,
    stride_rh,
    stride_ot,
    stride_oh,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    LATENT: tl.constexpr,  # PIECE or 2 * PIECE
    ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PIECE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    IDS_AHEAD: tl.constexpr,
):
    TWO: tl.constexpr = LATENT > PIECE
    row = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(row_seq_ptr + row).to(tl.int64)
    ctx = tl.load(row_ctx_ptr + row)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < NUM_HEADS
    offs_lo = tl.arange(0, PIECE)
    offs_hi = PIECE + offs_lo
    offs_r = tl.arange(0, BLOCK_R)
    # the queries transposed: [PIECE, H] (twice) and [R, H]
    q_cols = q_lat_ptr + row * stride_qt + heads[None, :].to(tl.int64) * stride_qh
    q_lo = tl.load(q_cols + offs_lo[:, None], mask=h_mask[None, :])
    q_hi = q_lo
    if TWO:
        q_hi = tl.load(q_cols + offs_hi[:, None], mask=h_mask[None, :])
    r_cols = q_rope_ptr + row * stride_rt + heads[None, :].to(tl.int64) * stride_rh
    qr = tl.load(r_cols + offs_r[:, None], mask=(offs_r < ROPE)[:, None] & h_mask[None, :])
    chunk = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_SIZE) * BLOCK_SIZE
    start = split * chunk
    end = tl.minimum(start + chunk, ctx)
    full_end = start + tl.maximum(end - start, 0) // BLOCK_SIZE * BLOCK_SIZE
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc_lo = tl.zeros([BLOCK_H, PIECE], tl.float32)
    acc_hi = tl.zeros([BLOCK_H, PIECE], tl.float32)
    table_row = block_tables_ptr + seq * stride_bt
    every = tl.arange(0, BLOCK_SIZE) < BLOCK_SIZE  # a full page: every row
    if IDS_AHEAD:
        page_next = tl.load(table_row + start // BLOCK_SIZE, mask=start < full_end, other=0)
    for n0 in range(start, full_end, BLOCK_SIZE):
        if IDS_AHEAD:
            page = page_next
            page_next = tl.load(table_row + n0 // BLOCK_SIZE + 1, mask=n0 + BLOCK_SIZE < full_end,
                                other=0)  # fmt: skip
        else:
            page = tl.load(table_row + n0 // BLOCK_SIZE)
        first = page * BLOCK_SIZE
        c_lo = c_desc.load([first, 0])
        c_hi = c_lo
        if TWO:
            c_hi = c_desc.load([first, PIECE])
        kr = r_desc.load([first, LATENT])
        m, denom, acc_lo, acc_hi = _page_step(q_lo, q_hi, qr, c_lo, c_hi, kr, every, m, denom,
                                              acc_lo, acc_hi, qk_scale, TWO, PRECISION)  # fmt: skip
    if full_end < end:  # the context ends inside this page: masked loads
        page = tl.load(table_row + full_end // BLOCK_SIZE).to(tl.int64)
        p_mask = full_end + tl.arange(0, BLOCK_SIZE) < end
        base = cache_ptr + (page * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE))[:, None] * (LATENT + ROPE)
        c_lo = tl.load(base + offs_lo[None, :], mask=p_mask[:, None], other=0.0)
        c_hi = c_lo
        if TWO:
            c_hi = tl.load(base + offs_hi[None, :], mask=p_mask[:, None], other=0.0)
        kr = tl.load(base + LATENT + offs_r[None, :], mask=p_mask[:, None] & (offs_r < ROPE)[None, :],
                     other=0.0)  # fmt: skip
        m, denom, acc_lo, acc_hi = _page_step(q_lo, q_hi, qr, c_lo, c_hi, kr, p_mask, m, denom,
                                              acc_lo, acc_hi, qk_scale, TWO, PRECISION)  # fmt: skip
    has = denom > 0
    inv = 1.0 / tl.where(has, denom, 1.0)
    mask = h_mask[:, None]
    if NUM_SPLITS == 1:
        dst = out_ptr + row * stride_ot + heads[:, None].to(tl.int64) * stride_oh
    else:
        at = (row * NUM_HEADS + heads.to(tl.int64)) * NUM_SPLITS + split
        dst = part_out_ptr + at[:, None] * LATENT
    tl.store(dst + offs_lo[None, :], (acc_lo * inv[:, None]).to(dst.dtype.element_ty), mask=mask)
    if TWO:
        tl.store(dst + offs_hi[None, :], (acc_hi * inv[:, None]).to(dst.dtype.element_ty),
                 mask=mask)  # fmt: skip
    if NUM_SPLITS > 1:
        lse = tl.where(has, m + tl.math.log2(tl.where(has, denom, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + at, lse, mask=h_mask)
        if FUSED_MERGE:
            counter = counter_ptr + row * tl.num_programs(1) + head_block
            merge_if_last_rolled(counter, part_out_ptr, part_lse_ptr, out_ptr, row, heads, h_mask,
                                 stride_ot, stride_oh, NUM_HEADS, LATENT, BLOCK_H, LATENT,
                                 NUM_SPLITS)  # fmt: skip


def latent_pieces(latent: int) -> int:
    """The width of the latent pieces the TMA kernel loads: latent itself up to 256, else half
    of it (so latent must be a power of two, at most 512)."""
    piece = latent if latent <= MAX_BOX else latent // 2
    if latent & (latent - 1) or latent < 16 or piece > MAX_BOX:
        raise ValueError(f"MlaVariant.TMA: latent width {latent} must be a power of two in 16..512")
    return piece


def tma_descriptors(cache: torch.Tensor, piece: int, block_r: int) -> tuple[object, object]:
    """Tensor descriptors over the cache [blocks, block_size, 1?, L + R] as [slots, L + R]."""
    rows = cache.view(-1, cache.shape[-1])
    block_size = cache.shape[1]
    return (
        TensorDescriptor.from_tensor(rows, [block_size, piece]),
        TensorDescriptor.from_tensor(rows, [block_size, block_r]),
    )
