"""Triton punica expand, in place: y[t, slice s] += u[t, s] B_(l, s)^T for each token t of
slot l (layouts: kernels/lora_reference.py, its reference; u from kernels/lora_shrink.py).

One program per (tile, column block, slice): columns start_s + [n BLOCK_N, (n + 1) BLOCK_N) of
the slice, for the tile's tokens (up to BLOCK_M of one slot: its B columns read once for all).
The grid's column blocks span the widest slice; a narrower slice's programs past its width exit,
as do unused tiles. It sums the shrink's K splits as it reads u, adds in fp32 and rounds once to
y's dtype; rows of tokens in no tile (no adapter, a graph's padding) are not touched.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .lora_shrink import rank_block
from .lora_tiles import TokenTiles


@triton.jit
def _expand_kernel(
    y_ptr, u_ptr, b_ptr, table_ptr, order_ptr, bounds_ptr,
    capacity, num_tokens, num_splits, stride_y, stride_b,
    NUM_SLICES: tl.constexpr, RANK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0).to(tl.int64)
    slot = tl.load(table_ptr + tile).to(tl.int64)
    if slot < 0:
        return
    n_first = tl.program_id(1).to(tl.int64) * BLOCK_N
    index = tl.program_id(2).to(tl.int64)
    col_start = tl.load(bounds_ptr + 2 * index)
    width = tl.load(bounds_ptr + 2 * index + 1)
    if n_first >= width:
        return
    start = tl.load(table_ptr + capacity + tile).to(tl.int64)
    end = tl.load(table_ptr + 2 * capacity + tile).to(tl.int64)
    pos = start + tl.arange(0, BLOCK_M).to(tl.int64)
    valid = pos < end
    token = tl.load(order_ptr + pos, mask=valid, other=0).to(tl.int64)
    valid = valid & (token < num_tokens)  # a stale plan (a graph's warm-up) stays in bounds
    n = n_first + tl.arange(0, BLOCK_N).to(tl.int64)
    n_mask = n < width
    cols = col_start + n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, RANK, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R).to(tl.int64)
        r_mask = r < RANK
        u = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for split in range(0, num_splits):
            row = (split * num_tokens + token) * NUM_SLICES + index
            u += tl.load(
                u_ptr + row[:, None] * RANK + r[None, :],
                mask=valid[:, None] & r_mask[None, :],
                other=0.0,
            )
        b = tl.load(
            b_ptr + cols[None, :] * stride_b + (slot * RANK + r)[:, None],
            mask=r_mask[:, None] & n_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.dot(u, b, input_precision=PRECISION)
    dst = y_ptr + token[:, None] * stride_y + cols[None, :]
    mask = valid[:, None] & n_mask[None, :]
    y = tl.load(dst, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


def slice_bounds(slices: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The expand's per-slice (first column, width) table [S, 2] int64 for `slices`' widths."""
    starts = [sum(slices[:i]) for i in range(len(slices))]
    flat = [v for pair in zip(starts, slices, strict=True) for v in pair]
    return torch.tensor(flat, dtype=torch.int64, device=device).view(len(slices), 2)


def lora_expand(
    y: torch.Tensor,
    u_parts: torch.Tensor,
    b_all: torch.Tensor,
    tiles: TokenTiles,
    bounds: torch.Tensor,
    max_width: int,
) -> None:
    """y [T, N] += the tiles' tokens' u B^T, in place; u_parts [SPLIT, T, S, R] fp32 (the
    shrink's), b_all [N, L x R], bounds from slice_bounds, max_width the widest slice."""
    num_splits, num_tokens, num_slices, rank = u_parts.shape
    if num_tokens == 0:
        return
    if y.stride(1) != 1 or b_all.stride(1) != 1 or not u_parts.is_contiguous():
        raise ValueError("lora_expand needs y, b_all contiguous along their rows, u contiguous")
    block_n = min(64, max(16, triton.next_power_of_2(max_width)))
    precision = "ieee" if y.dtype == torch.float32 else "tf32"
    grid = (tiles.grid_tiles(num_tokens), triton.cdiv(max_width, block_n), num_slices)
    _expand_kernel[grid](
        y, u_parts, b_all, tiles.table, tiles.order, bounds,
        tiles.capacity, num_tokens, num_splits, y.stride(0), b_all.stride(0),
        NUM_SLICES=num_slices, RANK=rank,
        BLOCK_M=tiles.tile_tokens, BLOCK_N=block_n, BLOCK_R=rank_block(rank),
        PRECISION=precision, num_warps=4,
    )  # fmt: skip
