"""The GEMM launch of the column-layout quantized matmuls (kernels/quant_fp8.py,
kernels/quant_int4.py): tiles, K splits while the grid is thin, the partials' buffer.

Their GEMV kernels keep their own copies of the loads they share (x as fp32 pairs, four words
of W per column): the int4 GEMV runs at 255 registers when N is not a multiple of its block,
and moving those loads into a shared @triton.jit helper changed its sm_90 SASS (registers
assigned otherwise) though its PTX instructions stayed the same: only the debug info of the
inlined helper differed, which ptxas reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from troupe.kernels.arrival import k_splits


@dataclass(frozen=True)
class ColsGemm:
    """A column-layout GEMM's launch for x [M, K] and N outputs."""

    grid: tuple[int, int, int]  # (M tiles, N tiles, K splits)
    block_m: int
    block_n: int
    per_split: int  # elements of K per split, a multiple of block_k
    part: torch.Tensor  # [S, M, N]: fp32 partials when split, else the output in x's dtype
    precision: str  # tl.dot's: exact for fp32 x (the CPU tests), tf32 (ignored by 16-bit) else


def cols_gemm(x: torch.Tensor, n: int, block_k: int) -> ColsGemm:
    """Tiles of 16 rows for skinny batches (K split while the grid is thin), else 64."""
    m, k = x.shape
    cuda = x.device.type == "cuda"
    block_m = 16 if m <= 16 or not cuda else 64
    block_n = 64 if cuda else 32
    tiles_m, tiles_n = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    chunks = triton.cdiv(k, block_k)
    split = k_splits(chunks, tiles_m * tiles_n, 4, x.device) if m <= 16 else 1
    dtype = torch.float32 if split > 1 else x.dtype
    return ColsGemm(
        grid=(tiles_m, tiles_n, split),
        block_m=block_m,
        block_n=block_n,
        per_split=triton.cdiv(chunks, split) * block_k,
        part=torch.empty(split, m, n, dtype=dtype, device=x.device),
        precision="ieee" if x.dtype == torch.float32 else "tf32",
    )
