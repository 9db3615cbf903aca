"""The wide decode GEMVs of kernels/quant_wide.py with every x row in each program (issue 16).

quant_wide's GEMVs run one program per (x row, tile of W rows): at 4 rows each weight tile is
read once from memory and three more times from L2, but its codes are converted four times.
Here a program takes BLOCK_M (M rounded up to a power of two, <= 8) x rows: the tile is
loaded and converted once and each code feeds BLOCK_M multiply-adds, through accumulators one
dimension wider ([BLOCK_M, BLOCK_N, ...]).

    Int4Gemv.ROWS_FOLD    int4, the 1 + q/16 conversion (quant_wide's FOLD)
    Fp8Gemv.ROWS_MAGIC    fp8, the bit-moved e4m3 conversion (quant_wide's fp8 MAGIC)
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl
from troupe.kernels.quant_wide import (
    FP8_SIGN_EXP_MANT,
    Fp8GemvConfig,
    Int4GemvConfig,
    fp8_byte_f32,
    nibble_f32,
)


@triton.jit
def _int4_rows_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K, row_words, row_groups,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    word = tl.arange(0, 4)
    acc = tl.zeros((BLOCK_M, BLOCK_N, GROUPS), dtype=tl.float32)
    for g0 in range(0, row_groups, GROUPS):
        g = g0 + tl.arange(0, GROUPS)
        g_ok = g < row_groups
        w = tl.load(
            w_ptr
            + rows64[:, None, None] * row_words
            + (g * 4)[None, :, None]
            + word[None, None, :],
            mask=row_ok[:, None, None] & g_ok[None, :, None],
            other=0,
        )
        # [BLOCK_M, GROUPS, 4]: nibble 0's element of each word, per x row
        x_at = (
            rm.to(tl.int64)[:, None, None] * K + (g * 32)[None, :, None] + (word * 4)[None, None, :]
        )
        x_mask = m_ok[:, None, None] & g_ok[None, :, None]
        part = tl.zeros((BLOCK_M, BLOCK_N, GROUPS, 4), dtype=tl.float32)
        x_sum = tl.zeros((BLOCK_M, GROUPS, 4), dtype=tl.float32)
        for j in tl.static_range(8):
            xj = tl.load(x_ptr + x_at + (j // 2 + 16 * (j % 2)), mask=x_mask, other=0.0)
            xj = xj.to(tl.float32)
            part += nibble_f32(w, j, 2)[None, :, :, :] * xj[:, None, :, :]
            x_sum += xj
        dot = tl.sum(part, axis=3)  # [BLOCK_M, BLOCK_N, GROUPS]
        xs = tl.sum(x_sum, axis=2)[:, None, :]
        sb_off = rows64[:, None] * row_groups + g[None, :]
        sb_mask = row_ok[:, None] & g_ok[None, :]
        s = tl.load(scale_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)
        b = tl.load(bias_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)
        acc += dot * (16.0 * s)[None, :, :] + (b - 16.0 * s)[None, :, :] * xs
    out = out_ptr + rm.to(tl.int64)[:, None] * N + rows[None, :]
    y = tl.sum(acc, axis=2).to(out_ptr.dtype.element_ty)
    tl.store(out, y, mask=m_ok[:, None] & row_ok[None, :])


@triton.jit
def _fp8_rows_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr,
    M, N, K, row_words, scale_bn, scale_bk, scale_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
    ONE_SCALE: tl.constexpr, SIGN_EXP_MANT: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    acc_w = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_W), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for w0 in range(0, row_words, BLOCK_W):
        wi = w0 + tl.arange(0, BLOCK_W)
        w_ok = wi < row_words
        w = tl.load(
            w_ptr + rows64[:, None] * row_words + wi[None, :],
            mask=row_ok[:, None] & w_ok[None, :],
            other=0,
        )
        x_at = rm.to(tl.int64)[:, None] * K + wi[None, :] * 4
        x_mask = m_ok[:, None] & w_ok[None, :]
        part = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_W), dtype=tl.float32)
        for b in tl.static_range(4):
            xb = tl.load(x_ptr + x_at + b, mask=x_mask, other=0.0).to(tl.float32)
            xb = xb * 18446744073709551616.0  # 2^64
            part += fp8_byte_f32(w, b, 1, SIGN_EXP_MANT)[None, :, :] * xb[:, None, :]
        if ONE_SCALE:
            acc_w += part
        else:  # BLOCK_W * 4 divides scale_bk: one scale per row for the tile
            s = tl.load(
                scale_ptr + (rows // scale_bn) * scale_cols + (w0 * 4) // scale_bk, mask=row_ok
            )
            acc += tl.sum(part, axis=2) * s[None, :]
    if ONE_SCALE:
        s = tl.load(scale_ptr + rows // scale_bn, mask=row_ok)
        acc = tl.sum(acc_w, axis=2) * s[None, :]
    acc = acc * 72057594037927936.0  # 2^56: 2^120 / 2^64
    out = out_ptr + rm.to(tl.int64)[:, None] * N + rows[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & row_ok[None, :])


def int4_rows(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    config: Int4GemvConfig,
) -> torch.Tensor:
    """x [M <= 8, K] @ W^T, every x row in each program (quant_gemv's int4 layout)."""
    m, k = x.shape
    n = packed.shape[0]
    words = packed.contiguous().view(torch.int32)  # [N, K/8]: K is a multiple of 32
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _int4_rows_kernel[(triton.cdiv(n, config.block_n),)](
        x.contiguous(), words, scale.contiguous(), bias.contiguous(), out, m, n, k, k // 8,
        k // 32, triton.next_power_of_2(m), config.block_n, config.groups,
        num_warps=config.num_warps,
    )  # fmt: skip
    return out


def fp8_rows(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, config: Fp8GemvConfig
) -> torch.Tensor:
    """x [M <= 8, K] @ W^T for fp8 W, every x row in each program (quant_wide.fp8_wide_fits)."""
    m, k = x.shape
    n = weight.shape[0]
    scale_bn = triton.cdiv(n, scale.shape[0])
    scale_bk = triton.cdiv(k, scale.shape[1])
    one_scale = scale.shape[1] == 1
    block_w = config.block_w if one_scale else min(config.block_w, (scale_bk & -scale_bk) // 4)
    words = weight.contiguous().view(torch.uint8).view(torch.int32)  # [N, K/4]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _fp8_rows_kernel[(triton.cdiv(n, config.block_n),)](
        x.contiguous(), words, scale.contiguous().float(), out, m, n, k, k // 4, scale_bn,
        scale_bk, scale.shape[1], triton.next_power_of_2(m), config.block_n, block_w,
        one_scale, FP8_SIGN_EXP_MANT, num_warps=config.num_warps,
    )  # fmt: skip
    return out
