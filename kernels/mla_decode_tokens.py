"""MLA decode pass 1, transposed: tokens are the M side of both products (MlaVariant.TOKENS_M).

The heads-as-rows kernel (kernels/mla_decode.py) multiplies [heads x 576] by [576 x BLOCK_N]:
with 16 heads that is an M = 16 product, which Hopper runs as mma.sync (wgmma needs M >= 64).
Here the same two products are transposed so that the wide side is M:

    s^T [BLOCK_N, H]  = c [BLOCK_N, L] @ q_lat^T [L, H] + k_r [BLOCK_N, R] @ q_rope^T [R, H]
    o^T [L, H]       += c^T [L, BLOCK_N] @ p^T [BLOCK_N, H]      (online softmax along axis 0)

so with BLOCK_N >= 64 the score product is an m64nHk16 wgmma and the value product an
m64 x (L / 64) one, the latent tile feeding both straight from shared memory (the second as a
transposed view). The arguments, splits and partial outputs are those of the heads-as-rows
kernel, so the same merge kernel and wrapper serve both.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from .mla_split_merge import merge_if_last
from .mla_tile import load_latent_tile


@triton.jit
def mla_split_tokens_kernel(
    q_lat_ptr,  # [T, H, L]
    q_rope_ptr,  # [T, H, R]
    cache_ptr,  # [slots, L + R]
    out_ptr,  # [T, H, L] when NUM_SPLITS == 1
    part_out_ptr,  # [T, H, NUM_SPLITS, L] otherwise (fp32, or the output dtype)
    part_lse_ptr,  # [T, H, NUM_SPLITS] fp32
    block_tables_ptr,
    row_seq_ptr,  # [T] int32: the sequence of each row
    row_ctx_ptr,  # [T] int32: tokens the row sees (0: padding row)
    counter_ptr,  # [T * head blocks] int32 arrival counters (FUSED_MERGE), zero between launches
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
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(row_seq_ptr + row).to(tl.int64)
    ctx = tl.load(row_ctx_ptr + row)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < NUM_HEADS
    offs_l = tl.arange(0, BLOCK_L)
    offs_r = tl.arange(0, BLOCK_R)
    l_mask = offs_l < LATENT
    r_mask = offs_r < ROPE
    # the queries loaded transposed: [L, H] and [R, H]
    q_cols = row * stride_qt + heads[None, :].to(tl.int64) * stride_qh
    q_t = tl.load(q_lat_ptr + q_cols + offs_l[:, None], mask=l_mask[:, None] & h_mask[None, :])
    r_cols = row * stride_rt + heads[None, :].to(tl.int64) * stride_rh
    qr_t = tl.load(q_rope_ptr + r_cols + offs_r[:, None], mask=r_mask[:, None] & h_mask[None, :])
    chunk = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, ctx)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_L, BLOCK_H], tl.float32)
    table_row = block_tables_ptr + seq * stride_bt
    if PREFETCH:
        c_next, kr_next = load_latent_tile(cache_ptr, table_row, start, end, offs_l, offs_r,
                                           l_mask, r_mask, BLOCK_SIZE, LATENT, ROPE, BLOCK_N)  # fmt: skip
    for n0 in range(start, end, BLOCK_N):
        if PREFETCH:
            c, kr = c_next, kr_next
            c_next, kr_next = load_latent_tile(cache_ptr, table_row, n0 + BLOCK_N, end, offs_l,
                                               offs_r, l_mask, r_mask, BLOCK_SIZE, LATENT, ROPE,
                                               BLOCK_N)  # fmt: skip
        else:
            c, kr = load_latent_tile(cache_ptr, table_row, n0, end, offs_l, offs_r, l_mask,
                                     r_mask, BLOCK_SIZE, LATENT, ROPE, BLOCK_N)  # fmt: skip
        p_mask = n0 + tl.arange(0, BLOCK_N) < end
        s = tl.dot(c, q_t, input_precision=PRECISION)
        s += tl.dot(kr, qr_t, input_precision=PRECISION)
        s = tl.where(p_mask[:, None], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        p = tl.math.exp2(s - m_new[None, :])
        alpha = tl.math.exp2(m - m_new)
        denom = denom * alpha + tl.sum(p, axis=0)
        acc = acc * alpha[None, :] + tl.dot(tl.trans(c), p.to(c.dtype), input_precision=PRECISION)
        m = m_new
    has = denom > 0
    o = acc / tl.where(has, denom, 1.0)[None, :]
    o_mask = l_mask[:, None] & h_mask[None, :]
    if NUM_SPLITS == 1:
        dst = out_ptr + row * stride_ot + heads[None, :].to(tl.int64) * stride_oh + offs_l[:, None]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        part = (row * NUM_HEADS + heads.to(tl.int64)) * NUM_SPLITS + split
        dst = part_out_ptr + part[None, :] * LATENT + offs_l[:, None]
        tl.store(dst, o.to(part_out_ptr.dtype.element_ty), mask=o_mask)
        lse = tl.where(has, m + tl.math.log2(tl.where(has, denom, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=h_mask)
        if FUSED_MERGE:
            counter = counter_ptr + row * tl.num_programs(1) + head_block
            merge_if_last(counter, part_out_ptr, part_lse_ptr, out_ptr, row, heads, h_mask,
                          stride_ot, stride_oh, NUM_HEADS, LATENT, BLOCK_H, BLOCK_L, NUM_SPLITS)  # fmt: skip
