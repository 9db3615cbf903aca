"""The MLA decode kernel: heads as rows, page-granular tiles (kernels/mla_decode.py launches it).

A heads-as-rows kernel with one block-table load per token was latency-bound on the H200 at
256 x 1,024 (ncu: 2 programs per SM by registers, long-scoreboard stalls on the block-table
load whose result addresses the tile: a dependent global load every iteration). This one loads
one block id per page, and the next tile's page ids one iteration early, carried in
registers, so the tile's addresses never wait on the table. (q_lat loaded inside the loop
instead of held in registers, and the 512 output columns split between two programs, lost on
the H200 and were removed: docs/benchmarks.md.)

Tiles are whole pages when BLOCK_N >= BLOCK_SIZE (BLOCK_N // BLOCK_SIZE ids per tile, one per
page); a smaller BLOCK_N reads one id per tile (start is a BLOCK_N multiple). More than one
split writes partial outputs that the last split of a row merges
(kernels/mla_split_merge.merge_if_last_rolled).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from .mla_split_merge import merge_if_last_rolled


@triton.jit
def _page_ids(table_row_ptr, n0, end, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The block ids of tile n0: one per page of the tile (or one for a sub-page tile)."""
    if BLOCK_N >= BLOCK_SIZE:
        offs_p = tl.arange(0, BLOCK_N // BLOCK_SIZE)
        ids = tl.load(table_row_ptr + n0 // BLOCK_SIZE + offs_p,
                      mask=n0 + offs_p * BLOCK_SIZE < end, other=0)  # fmt: skip
    else:
        ids = tl.load(table_row_ptr + n0 // BLOCK_SIZE, mask=n0 < end, other=0)
    return ids


@triton.jit
def _tile_rows(cache_ptr, ids, n0, BLOCK_SIZE: tl.constexpr, ROW: tl.constexpr,
               BLOCK_N: tl.constexpr):  # fmt: skip
    """Pointers to the BLOCK_N cache rows of tile n0 [BLOCK_N, 1] from its page ids."""
    if BLOCK_N >= BLOCK_SIZE:
        slots = tl.reshape(
            ids.to(tl.int64)[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :], [BLOCK_N]
        )
    else:
        slots = ids.to(tl.int64) * BLOCK_SIZE + n0 % BLOCK_SIZE + tl.arange(0, BLOCK_N)
    return cache_ptr + slots[:, None] * ROW


@triton.jit
def mla_split_paged_kernel(
    q_lat_ptr,  # [T, H, L]
    q_rope_ptr,  # [T, H, R]
    cache_ptr,  # [slots, L + R]
    out_ptr,  # [T, H, L] when NUM_SPLITS == 1
    part_out_ptr,  # [T, H, NUM_SPLITS, L] in the output dtype otherwise
    part_lse_ptr,  # [T, H, NUM_SPLITS] fp32
    block_tables_ptr,
    row_seq_ptr,  # [T] int32: the sequence of each row
    row_ctx_ptr,  # [T] int32: tokens the row sees (0: padding row)
    counter_ptr,  # [T * head blocks] int32 arrival counters (NUM_SPLITS > 1), zero between launches
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
):
    row = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(row_seq_ptr + row).to(tl.int64)
    ctx = tl.load(row_ctx_ptr + row)
    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = heads < NUM_HEADS
    offs_c = tl.arange(0, BLOCK_L)  # the output columns
    c_mask = offs_c < LATENT
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < ROPE
    q_rows = q_lat_ptr + row * stride_qt + heads[:, None].to(tl.int64) * stride_qh
    qc_mask = h_mask[:, None] & c_mask[None, :]
    r_rows = row * stride_rt + heads[:, None].to(tl.int64) * stride_rh
    qr = tl.load(q_rope_ptr + r_rows + offs_r[None, :], mask=h_mask[:, None] & r_mask[None, :])
    q = tl.load(q_rows + offs_c[None, :], mask=qc_mask)
    chunk = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, ctx)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_L], tl.float32)
    table_row = block_tables_ptr + seq * stride_bt
    ROW: tl.constexpr = LATENT + ROPE
    ids_next = _page_ids(table_row, start, end, BLOCK_SIZE, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        ids = ids_next
        ids_next = _page_ids(table_row, n0 + BLOCK_N, end, BLOCK_SIZE, BLOCK_N)
        p_mask = n0 + tl.arange(0, BLOCK_N) < end
        base = _tile_rows(cache_ptr, ids, n0, BLOCK_SIZE, ROW, BLOCK_N)
        c = tl.load(base + offs_c[None, :], mask=p_mask[:, None] & c_mask[None, :], other=0.0)
        kr = tl.load(base + LATENT + offs_r[None, :], mask=p_mask[:, None] & r_mask[None, :],
                     other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(c), input_precision=PRECISION)
        s += tl.dot(qr, tl.trans(kr), input_precision=PRECISION)
        s = tl.where(p_mask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=PRECISION)
        m = m_new
    has = denom > 0
    o = acc / tl.where(has, denom, 1.0)[:, None]
    o_mask = h_mask[:, None] & c_mask[None, :]
    if NUM_SPLITS == 1:
        dst = out_ptr + row * stride_ot + heads[:, None].to(tl.int64) * stride_oh + offs_c[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        at = (row * NUM_HEADS + heads.to(tl.int64)) * NUM_SPLITS + split
        dst = part_out_ptr + at[:, None] * LATENT + offs_c[None, :]
        tl.store(dst, o.to(part_out_ptr.dtype.element_ty), mask=o_mask)
        lse = tl.where(has, m + tl.math.log2(tl.where(has, denom, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + at, lse, mask=h_mask)
        counter = counter_ptr + row * tl.num_programs(1) + head_block
        merge_if_last_rolled(counter, part_out_ptr, part_lse_ptr, out_ptr, row, heads, h_mask,
                             stride_ot, stride_oh, NUM_HEADS, LATENT, BLOCK_H, BLOCK_L, NUM_SPLITS)  # fmt: skip
