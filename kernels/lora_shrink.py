"""Triton punica shrink: u[t, s] = A_(l, s) x_t for each token t of slot l, fp32 (layouts:
kernels/lora_reference.py, which is its reference).

One program per (tile, column block of u, K split). A tile (kernels/lora_tiles.py) is up to
BLOCK_M tokens of one slot, so the program reads that slot's [S R, K] rows of A (contiguous:
every slice's) once for all of them, and x once for every slice (S R <= 64 columns: one
block): the work follows the step's tokens, not max_loras x max_lora_rank (the masked form,
gpu/lora_linear.py). A tile whose slot is -1 (unused) exits at once; tokens without an adapter
are in no tile and their rows of u are never written (the expand never reads them).

    u_parts [SPLIT, T, S, R] fp32: split p sums K columns [p k_split, (p + 1) k_split)

Split K (SPLIT > 1, static from T and K) gives a decode step's few tiles enough programs to
fill the device; the expand adds the splits up as it reads u (no atomics, no zeroing, the same
sums every run). On CUDA the dot takes the model's dtype (bf16 tensor cores, fp32 sums; an
fp32 model's dot is exact, "ieee"); the Triton interpreter (the CPU) upcasts loads to fp32
first, as its bf16 arithmetic is wrong. Offsets are int64.
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
from .sm_count import num_sms

# At most 8 K splits: the expand reads every split of u once per program (up to 512 columns of
# y), so more splits cost it more than they give the shrink's few decode tiles
_MAX_SPLIT = 8


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, u_ptr, table_ptr, order_ptr,
    capacity, num_tokens, in_features, k_split, stride_x, stride_a,
    WIDTH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0).to(tl.int64)
    slot = tl.load(table_ptr + tile).to(tl.int64)
    if slot < 0:
        return
    split = tl.program_id(2).to(tl.int64)
    token, valid = tile_token_rows(table_ptr, order_ptr, capacity, tile, num_tokens, BLOCK_M)
    j = tl.program_id(1).to(tl.int64) * BLOCK_J + tl.arange(0, BLOCK_J).to(tl.int64)
    j_mask = j < WIDTH  # j = s R + r: the slot's rows of A, every slice's, are contiguous
    k_first = split * k_split
    k_stop = tl.minimum(k_first + k_split, in_features)
    acc = tl.zeros((BLOCK_M, BLOCK_J), dtype=tl.float32)
    for k0 in range(0, k_split, BLOCK_K):
        k = k_first + k0 + tl.arange(0, BLOCK_K).to(tl.int64)
        k_mask = k < k_stop
        x = tl.load(
            x_ptr + token[:, None] * stride_x + k[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        )
        a = tl.load(
            a_ptr + (slot * WIDTH + j)[None, :] * stride_a + k[:, None],
            mask=j_mask[None, :] & k_mask[:, None],
            other=0.0,
        )
        if UPCAST:  # the interpreter: its bf16 arithmetic is wrong
            x, a = x.to(tl.float32), a.to(tl.float32)
        acc += tl.dot(x, a, input_precision=PRECISION)
    row = split * num_tokens + token
    tl.store(u_ptr + row[:, None] * WIDTH + j[None, :], acc, mask=valid[:, None] & j_mask[None, :])


# 8 warps and K blocks of 32: 80 registers a thread on sm_90, 3 programs an SM (bf16, S R = 48;
# 4 warps: 176, 2); ops/lora_compile_check.py builds them without a GPU
NUM_WARPS = 8


def shrink_constexprs(
    width: int, in_features: int, tile_tokens: int, dtype: torch.dtype, is_cuda: bool
) -> dict[str, int | str | bool]:
    """The kernel's compile-time arguments for u rows of `width` (S R) from x [T, in_features]."""
    return {
        "WIDTH": width,
        "BLOCK_M": tile_tokens,
        "BLOCK_J": min(64, max(16, int(triton.next_power_of_2(width)))),  # tl.dot: >= 16
        "BLOCK_K": min(32, max(16, int(triton.next_power_of_2(in_features)))),
        "PRECISION": dot_precision(dtype),
        "UPCAST": not is_cuda,  # the interpreter: its bf16 arithmetic is wrong
    }


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
    width = num_slices * rank  # one token's u: every slice's R values
    consts = shrink_constexprs(width, in_features, tiles.tile_tokens, x.dtype, x.is_cuda)
    block_j, block_k = int(consts["BLOCK_J"]), int(consts["BLOCK_K"])
    num_jb = triton.cdiv(width, block_j)
    grid_tiles = tiles.grid_tiles(num_tokens)
    if split_k is None:
        split_k = triton.cdiv(num_sms(x.device), grid_tiles * num_jb)
        split_k = max(1, min(split_k, _MAX_SPLIT, triton.cdiv(in_features, 4 * block_k)))
    k_split = triton.cdiv(triton.cdiv(in_features, split_k), block_k) * block_k
    split_k = triton.cdiv(in_features, k_split)  # no split left empty
    u = torch.empty(split_k, num_tokens, num_slices, rank, dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return u
    _shrink_kernel[(grid_tiles, num_jb, split_k)](
        x, a_all, u, tiles.table, tiles.order,
        tiles.capacity, num_tokens, in_features, k_split, x.stride(0), a_all.stride(0),
        **consts, num_warps=NUM_WARPS,
    )  # fmt: skip
    return u
