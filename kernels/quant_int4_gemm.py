"""The GEMM of the int4 column layout (kernels/quant_int4.Int4Cols), for more rows of x than
its decode GEMV takes: tiles of words expanded to bytes, nibbles, x's dtype, tl.dot; K split
while the grid is thin (skinny batches), the fp32 partials summed by a second kernel.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl
from troupe.kernels.quant_cols import cols_gemm


@triton.jit
def _int4_cols_gemm_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, K, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = rn < N
    word = tl.arange(0, BLOCK_K // 8)
    byte = tl.arange(0, BLOCK_K // 2)
    group = tl.arange(0, BLOCK_K // 32)
    shift = tl.arange(0, 4) * 8
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        r = k0 // 8 + word
        w = tl.load(
            w_ptr + r.to(tl.int64)[:, None] * N + rn[None, :],
            mask=(r < K // 8)[:, None] & col_ok[None, :],
            other=0,
        )
        # bytes [BLOCK_K / 2, BLOCK_N]: byte 4r + j is bits 8j..8j+7 of word r
        p = tl.reshape((w[:, None, :] >> shift[None, :, None]) & 255, (BLOCK_K // 2, BLOCK_N))
        g = k0 // 32 + group
        sb_off = g.to(tl.int64)[:, None] * N + rn[None, :]
        sb_mask = (g < K // 32)[:, None] & col_ok[None, :]
        s = tl.load(s_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)[:, None, :]
        b = tl.load(b_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)[:, None, :]
        # shapes spelled inline: a tuple held in a variable stops being constexpr (triton 3.6)
        w_lo = tl.reshape(
            tl.reshape((p & 15).to(tl.float32), (BLOCK_K // 32, 16, BLOCK_N)) * s + b,
            (BLOCK_K // 2, BLOCK_N),
        )
        w_hi = tl.reshape(
            tl.reshape((p >> 4).to(tl.float32), (BLOCK_K // 32, 16, BLOCK_N)) * s + b,
            (BLOCK_K // 2, BLOCK_N),
        )
        kb = k0 // 2 + byte
        elem = (kb // 16) * 32 + kb % 16  # the low nibble's element; the high one's: + 16
        x_off = rm.to(tl.int64)[:, None] * K + elem[None, :]
        x_mask = (rm < M)[:, None] & (kb < K // 2)[None, :]
        xe = tl.load(x_ptr + x_off, mask=x_mask, other=0.0)
        xo = tl.load(x_ptr + x_off + 16, mask=x_mask, other=0.0)
        acc += tl.dot(xe, w_lo.to(xe.dtype), input_precision=PRECISION)
        acc += tl.dot(xo, w_hi.to(xo.dtype), input_precision=PRECISION)
    out = out_ptr + (pid_k.to(tl.int64) * M + rm.to(tl.int64))[:, None] * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm < M)[:, None] & col_ok[None, :])


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, S, MN, BLOCK: tl.constexpr):
    """out = sum over S of part [S, MN] (fp32, in split order), in out's dtype."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(S):
        acc += tl.load(part_ptr + s * MN + i, mask=ok, other=0.0)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _finish(part: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The output [M, N] from the partials [S, M, N]: split 1 is the output itself."""
    if part.shape[0] == 1:
        return part[0]
    s, m, n = part.shape
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block = 1024
    _sum_splits_kernel[(triton.cdiv(m * n, block),)](part, out, s, m * n, block)
    return out


def int4_cols_gemm(
    x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """x [M, K] (contiguous) @ W^T for W's words [K/8, N], scale and bias [K/32, N]."""
    m, k = x.shape
    n = words.shape[1]
    block_k = 128 if x.device.type == "cuda" else 64
    g = cols_gemm(x, n, block_k)
    _int4_cols_gemm_kernel[g.grid](
        x, words, scale, bias, g.part, m, n, k, g.per_split, g.block_m, g.block_n, block_k,
        g.precision, num_warps=4,
    )  # fmt: skip
    return _finish(g.part, x)
