"""Triton punica expand, in place: y[t, slice s] += u[t, s] B_(l, s)^T for each token t of
slot l (layouts: kernels/lora_reference.py, its reference; u from kernels/lora_shrink.py).

One program per (tile, column group, slice): up to N_BLOCKS blocks of BLOCK_N columns of the
slice, for the tile's tokens (up to BLOCK_M of one slot: its B columns read once for all, and
their rows of u once for the whole group). The grid's groups span the widest slice; a narrower
slice's programs past its width exit, as do unused tiles. It sums the shrink's K splits as it
reads u, rounds them to B's dtype for the dot on CUDA (the interpreter upcasts B instead: its
bf16 arithmetic is wrong), adds in fp32 and rounds once to y's dtype; rows of tokens in no
tile (no adapter, a graph's padding) are not touched.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_attention import dot_precision
from .lora_tile_rows import tile_token_rows
from .lora_tiles import TokenTiles

# Column blocks per program: u is read (its K splits summed) once per program, then serves up
# to 16 x 32 columns of y; a decode's few tiles still make enough programs over a wide slice.
# Blocks of 32 columns with 8 warps take ~70 registers a thread on sm_90 (3 programs an SM;
# 64 columns: ~140, 1 program); ops/lora_compile_check.py builds them without a GPU
_GROUP_BLOCKS = 16
NUM_WARPS = 8


@triton.jit
def _u_columns(
    u_ptr, num_splits, num_tokens, token, valid, col, col_mask,
    WIDTH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """u[token, col] [BLOCK_M, BLOCK_R] fp32, the shrink's K splits summed."""
    u = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for split in range(0, num_splits):
        row = split * num_tokens + token
        u += tl.load(
            u_ptr + row[:, None] * WIDTH + col[None, :],
            mask=valid[:, None] & col_mask[None, :],
            other=0.0,
        )
    return u


@triton.jit
def _expand_kernel(
    y_ptr, u_ptr, b_ptr, table_ptr, order_ptr, bounds_ptr,
    capacity, num_tokens, num_splits, stride_y, stride_b,
    RANK: tl.constexpr, WIDTH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    N_BLOCKS: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0).to(tl.int64)
    slot = tl.load(table_ptr + tile).to(tl.int64)
    if slot < 0:
        return
    group_first = tl.program_id(1).to(tl.int64) * (BLOCK_N * N_BLOCKS)
    index = tl.program_id(2).to(tl.int64)
    col_start = tl.load(bounds_ptr + 2 * index)
    width = tl.load(bounds_ptr + 2 * index + 1)
    if group_first >= width:
        return
    token, valid = tile_token_rows(table_ptr, order_ptr, capacity, tile, num_tokens, BLOCK_M)
    r = tl.arange(0, BLOCK_R).to(tl.int64)
    if RANK <= BLOCK_R:  # the common case: u read once for all the group's columns
        u_whole = _u_columns(
            u_ptr, num_splits, num_tokens, token, valid, index * RANK + r, r < RANK,
            WIDTH, BLOCK_M, BLOCK_R,
        )  # fmt: skip
    for block in range(N_BLOCKS):
        n = group_first + block * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
        n_mask = n < width
        cols = col_start + n
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r0 in range(0, RANK, BLOCK_R):
            if RANK <= BLOCK_R:
                u = u_whole
            else:
                col_mask = r0 + r < RANK
                u = _u_columns(
                    u_ptr, num_splits, num_tokens, token, valid, index * RANK + r0 + r,
                    col_mask, WIDTH, BLOCK_M, BLOCK_R,
                )  # fmt: skip
            b = tl.load(
                b_ptr + cols[None, :] * stride_b + (slot * RANK + r0 + r)[:, None],
                mask=(r0 + r < RANK)[:, None] & n_mask[None, :],
                other=0.0,
            )
            if UPCAST:  # the interpreter: its bf16 arithmetic is wrong
                acc += tl.dot(u, b.to(tl.float32), input_precision=PRECISION)
            else:  # u rounded to B's dtype, as the masked form's GEMM takes it
                acc += tl.dot(u.to(b.dtype), b, input_precision=PRECISION)
        dst = y_ptr + token[:, None] * stride_y + cols[None, :]
        mask = valid[:, None] & n_mask[None, :]
        y = tl.load(dst, mask=mask, other=0.0).to(tl.float32)
        tl.store(dst, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


def expand_constexprs(
    rank: int, num_slices: int, max_width: int, tile_tokens: int, dtype: torch.dtype, is_cuda: bool
) -> dict[str, int | str | bool]:
    """The kernel's compile-time arguments for slices of rank `rank`, the widest `max_width`."""
    block_n = min(32, max(16, int(triton.next_power_of_2(max_width))))
    return {
        "RANK": rank,
        "WIDTH": num_slices * rank,
        "BLOCK_M": tile_tokens,
        "BLOCK_N": block_n,
        "N_BLOCKS": min(_GROUP_BLOCKS, triton.cdiv(max_width, block_n)),
        "BLOCK_R": min(64, max(16, int(triton.next_power_of_2(rank)))),  # tl.dot: >= 16
        "PRECISION": dot_precision(dtype),
        "UPCAST": not is_cuda,  # the interpreter: its bf16 arithmetic is wrong
    }


def lora_expand(
    y: torch.Tensor,
    u_parts: torch.Tensor,
    b_all: torch.Tensor,
    tiles: TokenTiles,
    bounds: torch.Tensor,
    max_width: int,
) -> None:
    """y [T, N] += the tiles' tokens' u B^T, in place; u_parts [SPLIT, T, S, R] fp32 (the
    shrink's), b_all [N, L x R], bounds from lora_tiles.slice_bounds, max_width the widest slice."""
    num_splits, num_tokens, num_slices, rank = u_parts.shape
    if num_tokens == 0:
        return
    if y.stride(1) != 1 or b_all.stride(1) != 1 or not u_parts.is_contiguous():
        raise ValueError("lora_expand needs y, b_all contiguous along their rows, u contiguous")
    consts = expand_constexprs(rank, num_slices, max_width, tiles.tile_tokens, y.dtype, y.is_cuda)
    columns = int(consts["BLOCK_N"]) * int(consts["N_BLOCKS"])
    grid = (tiles.grid_tiles(num_tokens), triton.cdiv(max_width, columns), num_slices)
    _expand_kernel[grid](
        y, u_parts, b_all, tiles.table, tiles.order, bounds,
        tiles.capacity, num_tokens, num_splits, y.stride(0), b_all.stride(0),
        **consts, num_warps=NUM_WARPS,
    )  # fmt: skip
