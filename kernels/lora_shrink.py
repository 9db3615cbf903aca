"""Triton punica shrink: u[t, s] = A_(l, s) x_t for each token t of slot l, fp32 (layouts:
kernels/lora_reference.py, which is its reference).

One program per (tile, slice x rank block, K split). A tile (kernels/lora_tiles.py) is up to
BLOCK_M tokens of one slot, so the program reads that slot's [R, K] rows of A once for all of
them: the work follows the step's tokens, not max_loras x max_lora_rank (the masked form,
gpu/lora_linear.py). A tile whose slot is -1 (unused) exits at once; tokens without an adapter
are in no tile and their rows of u are never written (the expand never reads them).

    u_parts [SPLIT, T, S, R] fp32: split p sums K columns [p k_split, (p + 1) k_split)

Split K (SPLIT > 1, static from T and K) gives a decode step's few tiles enough programs to
fill the device; the expand adds the splits up as it reads u (no atomics, no zeroing, the same
sums every run). Loads are upcast to fp32 before the dot (the Triton interpreter's bf16
arithmetic is wrong otherwise); offsets are int64.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .lora_tiles import TokenTiles
from .sm_count import num_sms

# At most 4 K splits: the expand re-reads every split of u once per column block, so more
# splits cost it more L2 traffic than they save the shrink (a decode of 64 tokens in 4 slots on
# a q/k/v of 4,096 + 2 x 1,024 columns: 960 expand programs x 16 tokens x R fp32 per split)
_MAX_SPLIT = 4


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, u_ptr, table_ptr, order_ptr,
    capacity, num_tokens, in_features, k_split, stride_x, stride_a,
    NUM_SLICES: tl.constexpr, RANK: tl.constexpr, NUM_RB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0).to(tl.int64)
    slot = tl.load(table_ptr + tile).to(tl.int64)
    if slot < 0:
        return
    index = tl.program_id(1).to(tl.int64) // NUM_RB
    r_block = tl.program_id(1).to(tl.int64) % NUM_RB
    split = tl.program_id(2).to(tl.int64)
    start = tl.load(table_ptr + capacity + tile).to(tl.int64)
    end = tl.load(table_ptr + 2 * capacity + tile).to(tl.int64)
    pos = start + tl.arange(0, BLOCK_M).to(tl.int64)
    valid = pos < end
    token = tl.load(order_ptr + pos, mask=valid, other=0).to(tl.int64)
    valid = valid & (token < num_tokens)  # a stale plan (a graph's warm-up) stays in bounds
    r = r_block * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    r_mask = r < RANK
    a_rows = (slot * NUM_SLICES + index) * RANK + r
    k_first = split * k_split
    k_stop = tl.minimum(k_first + k_split, in_features)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, k_split, BLOCK_K):
        k = k_first + k0 + tl.arange(0, BLOCK_K).to(tl.int64)
        k_mask = k < k_stop
        x = tl.load(
            x_ptr + token[:, None] * stride_x + k[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        a = tl.load(
            a_ptr + a_rows[None, :] * stride_a + k[:, None],
            mask=r_mask[None, :] & k_mask[:, None],
            other=0.0,
        ).to(tl.float32)
        acc += tl.dot(x, a, input_precision=PRECISION)
    row = (split * num_tokens + token) * NUM_SLICES + index
    tl.store(u_ptr + row[:, None] * RANK + r[None, :], acc, mask=valid[:, None] & r_mask[None, :])


def rank_block(rank: int) -> int:
    """The rank columns one program holds (tl.dot needs >= 16; wider ranks take several)."""
    return min(64, max(16, int(triton.next_power_of_2(rank))))


def lora_shrink(
    x: torch.Tensor,
    a_all: torch.Tensor,
    tiles: TokenTiles,
    num_slices: int,
    rank: int,
    *,
    split_k: int | None = None,
) -> torch.Tensor:
    """u_parts [SPLIT, T, S, R] fp32 of x [T, K] (rows of tokens in no tile unwritten);
    split_k None: sized from the static shapes so that the grid fills the device."""
    num_tokens, in_features = x.shape
    if x.stride(1) != 1 or a_all.stride(1) != 1:
        raise ValueError("lora_shrink needs x and a_all contiguous along K")
    block_r = rank_block(rank)
    num_rb = triton.cdiv(rank, block_r)
    block_k = min(64, max(16, triton.next_power_of_2(in_features)))
    grid_tiles = tiles.grid_tiles(num_tokens)
    if split_k is None:
        programs = grid_tiles * num_slices * num_rb
        split_k = triton.cdiv(num_sms(x.device), programs)
        split_k = max(1, min(split_k, _MAX_SPLIT, triton.cdiv(in_features, 4 * block_k)))
    k_split = triton.cdiv(triton.cdiv(in_features, split_k), block_k) * block_k
    split_k = triton.cdiv(in_features, k_split)  # no split left empty
    u = torch.empty(split_k, num_tokens, num_slices, rank, dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return u
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _shrink_kernel[(grid_tiles, num_slices * num_rb, split_k)](
        x, a_all, u, tiles.table, tiles.order,
        tiles.capacity, num_tokens, in_features, k_split, x.stride(0), a_all.stride(0),
        NUM_SLICES=num_slices, RANK=rank, NUM_RB=num_rb,
        BLOCK_M=tiles.tile_tokens, BLOCK_R=block_r, BLOCK_K=block_k, PRECISION=precision,
        num_warps=4,
    )  # fmt: skip
    return u
