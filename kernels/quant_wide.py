"""Decode GEMVs over quantized weights read as int32 words (16 bytes a thread), issue 16.

kernels/quant_gemv.py's byte GEMVs spend their time converting, not loading (H200, Llama-8B
step: int4 at 29% of copy, fp8 at 63%): every code goes through an integer-to-float convert,
which sm_90 issues at 16 a clock per SM against 128 for integer and fp32 arithmetic. These
variants load each weight row as int32 words in tiles whose innermost dimension is 4 words
(16 contiguous bytes), take the codes out with shifts and masks, and turn them into fp32 with
integer arithmetic ("magic numbers") instead of the convert:

    int4   tile [BLOCK_N rows, GROUPS groups of 32, 4 words]; word w of a group holds bytes
           4w..4w+3, so its nibble j (bits 4j..4j+3) is element 4w + j // 2 (+ 16 if j is odd)
           in Q4_0 order. Per group: part = sum over the group of x * f(q), then the group's
           scale and bias once: y += s * (x . q) + b * sum(x) (fp32 throughout).
             CVT    f(q) = q through the convert (the baseline of this form)
             MAGIC  OR q into the mantissa of 2^23 (0x4B000000 | q = 2^23 + q), subtract 2^23
             FOLD   OR q into the top mantissa bits of 1.0 (0x3F800000 | q << 19 = 1 + q/16):
                    shift, mask-or, multiply-add per nibble, the 1 folded into the group's
                    terms: x . q = 16 (part - sum(x)), so y += 16 s part + (b - 16 s) sum(x)
    fp8    tile [BLOCK_N rows, BLOCK_W words]; byte b of a word is element 4w + b.
             CVT    byte -> e4m3 -> fp32 through the hardware converts
             MAGIC  the byte's sign to bit 31 and its exponent and mantissa to bits 20-26 of an
                    fp32 (shift the byte to the top, arithmetic shift right 4, mask): the e4m3
                    value times 2^-120, subnormals included. x is scaled by 2^64 on load and the
                    row by 2^56 at the end (powers of two: exact) so no product is subnormal.

One x row per program, programs ordered row of x fastest (the programs reading one weight tile
run together: the second and later x rows find it in L2); rows of W per program are few so
even 4,096 output rows fill the device several times over without splitting K.
The configs are frozen dataclasses; quant_gemv.INT4_GEMV / FP8_GEMV pick the engine's.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


class Int4Gemv(enum.Enum):
    BYTES = "bytes"  # quant_gemv._int4_gemv_kernel: uint8 tiles, split K (the old default)
    WIDE_CVT = "wide_cvt"
    WIDE_MAGIC = "wide_magic"
    WIDE_FOLD = "wide_fold"
    ROWS_FOLD = "rows_fold"  # WIDE_FOLD, every x row in each program (quant_rows.py)
    HALF2 = "half2"  # packed f16x2 PTX, one x packing for all rows (quant_half2.py)


class Fp8Gemv(enum.Enum):
    BYTES = "bytes"  # quant_gemv._fp8_gemv_kernel: fp8 tiles, split K (the old default)
    WIDE_CVT = "wide_cvt"
    WIDE_MAGIC = "wide_magic"
    ROWS_MAGIC = "rows_magic"  # WIDE_MAGIC, every x row in each program (quant_rows.py)
    HALF2 = "half2"  # packed f16x2 PTX, one x packing for all rows (quant_half2.py)


@dataclass(frozen=True)
class Int4GemvConfig:
    """The int4 decode GEMV: variant, W rows per program, groups of 32 per row per iteration
    (wide variants; a power of two), warps, and (WIDE_*) how x is read: one 2-byte load per
    nibble, or x_split: two 8-byte loads per word, taken apart with tl.split. k_splits
    (HALF2): K splits, 0 = ~4 programs per SM (quant_half2.launch_shape). HALF2 only:
    prefetch loads the next iteration's W, scales, biases and x into registers before this
    one's arithmetic (fp8: W, block scales, x); num_stages (0: Triton's default) and max_registers (0: no cap) go to the launch."""

    variant: Int4Gemv = Int4Gemv.BYTES
    block_n: int = 4
    groups: int = 16
    num_warps: int = 4
    x_split: bool = False
    k_splits: int = 1
    prefetch: bool = False
    num_stages: int = 0
    max_registers: int = 0


@dataclass(frozen=True)
class Fp8GemvConfig:
    """The fp8 decode GEMV: variant, W rows per program, int32 words (4 codes each) per row per
    iteration (wide variants; a power of two), warps, and (WIDE_*) how x is read: one 2-byte
    load per code, or x_split: one 8-byte load per word, taken apart with tl.split. k_splits
    (HALF2): K splits, 0 = ~4 programs per SM (quant_half2.launch_shape); prefetch,
    num_stages, max_registers (HALF2) as Int4GemvConfig's."""

    variant: Fp8Gemv = Fp8Gemv.BYTES
    block_n: int = 4
    block_w: int = 128
    num_warps: int = 4
    x_split: bool = False
    k_splits: int = 1
    prefetch: bool = False
    num_stages: int = 0
    max_registers: int = 0


_INT4_CONVERT = {Int4Gemv.WIDE_CVT: 0, Int4Gemv.WIDE_MAGIC: 1, Int4Gemv.WIDE_FOLD: 2}
_FP8_CONVERT = {Fp8Gemv.WIDE_CVT: 0, Fp8Gemv.WIDE_MAGIC: 1}
FP8_SIGN_EXP_MANT = 0x87F00000 - 2**32  # bits 31 and 20-26, as an int32


@triton.jit
def nibble_f32(w, J: tl.constexpr, CONVERT: tl.constexpr):
    """Nibble J of each int32 word as fp32: q (CONVERT 0 convert, 1 magic 2^23), 1 + q/16 (2)."""
    if CONVERT == 0:
        return ((w >> (4 * J)) & 15).to(tl.float32)
    elif CONVERT == 1:
        bits = ((w >> (4 * J)) & 15) | 0x4B000000
        return bits.to(tl.float32, bitcast=True) - 8388608.0
    else:
        if 4 * J <= 19:
            moved = w << (19 - 4 * J)
        else:
            moved = w >> (4 * J - 19)
        return ((moved & 0x00780000) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _quarters(x, GROUPS: tl.constexpr):
    """[GROUPS, 4, 4] -> its four [GROUPS, 4] slices along the last dimension."""
    even, odd = tl.split(tl.reshape(x, (GROUPS, 4, 2, 2)))
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit(do_not_specialize=["M"])  # one compile for every row count
def _int4_wide_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K, row_words, row_groups,
    BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, CONVERT: tl.constexpr, X_SPLIT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    m, pid_n = pid % M, pid // M
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)
    word = tl.arange(0, 4)
    x_row = x_ptr + m.to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
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
        if X_SPLIT:  # two 8-byte x loads a word: its low nibbles' 4 elements, its high ones'
            x_at = (g * 32)[:, None, None] + (word * 4)[None, :, None] + word[None, None, :]
            x_lo = tl.load(x_row + x_at, mask=g_ok[:, None, None], other=0.0).to(tl.float32)
            x_hi = tl.load(x_row + x_at + 16, mask=g_ok[:, None, None], other=0.0)
            x_hi = x_hi.to(tl.float32)
            lo0, lo1, lo2, lo3 = _quarters(x_lo, GROUPS)
            hi0, hi1, hi2, hi3 = _quarters(x_hi, GROUPS)
            part = nibble_f32(w, 0, CONVERT) * lo0[None, :, :]
            part += nibble_f32(w, 1, CONVERT) * hi0[None, :, :]
            part += nibble_f32(w, 2, CONVERT) * lo1[None, :, :]
            part += nibble_f32(w, 3, CONVERT) * hi1[None, :, :]
            part += nibble_f32(w, 4, CONVERT) * lo2[None, :, :]
            part += nibble_f32(w, 5, CONVERT) * hi2[None, :, :]
            part += nibble_f32(w, 6, CONVERT) * lo3[None, :, :]
            part += nibble_f32(w, 7, CONVERT) * hi3[None, :, :]
            xs = tl.sum(tl.sum(x_lo + x_hi, axis=2), axis=1)[None, :]
        else:  # one 2-byte x load a nibble (L1 hits)
            x_at2 = (g * 32)[:, None] + (word * 4)[None, :]  # [GROUPS, 4]: nibble 0's element
            part = tl.zeros((BLOCK_N, GROUPS, 4), dtype=tl.float32)
            x_sum = tl.zeros((GROUPS, 4), dtype=tl.float32)
            for j in tl.static_range(8):
                x_j = x_row + x_at2 + (j // 2 + 16 * (j % 2))
                xj = tl.load(x_j, mask=g_ok[:, None], other=0.0).to(tl.float32)
                part += nibble_f32(w, j, CONVERT) * xj[None, :, :]
                x_sum += xj
            xs = tl.sum(x_sum, axis=1)[None, :]
        dot = tl.sum(part, axis=2)
        sb_off = rows64[:, None] * row_groups + g[None, :]
        sb_mask = row_ok[:, None] & g_ok[None, :]
        s = tl.load(scale_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)
        b = tl.load(bias_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)
        if CONVERT == 2:
            acc += dot * (16.0 * s) + (b - 16.0 * s) * xs
        else:
            acc += dot * s + b * xs
    out = out_ptr + m.to(tl.int64) * N + rows
    tl.store(out, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def fp8_byte_f32(w, B: tl.constexpr, CONVERT: tl.constexpr, SIGN_EXP_MANT: tl.constexpr):
    """Byte B of each int32 word as fp32: the e4m3 value (CONVERT 0), it times 2^-120 (1)."""
    if CONVERT == 0:
        code = ((w >> (8 * B)) & 255).to(tl.uint8)
        return code.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        if B < 3:
            top = w << (24 - 8 * B)
        else:
            top = w
        return ((top >> 4) & SIGN_EXP_MANT).to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["M"])  # one compile for every row count
def _fp8_wide_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr,
    M, N, K, row_words, scale_bn, scale_bk, scale_cols,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, CONVERT: tl.constexpr,
    ONE_SCALE: tl.constexpr, SIGN_EXP_MANT: tl.constexpr, X_SPLIT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    m, pid_n = pid % M, pid // M
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows64 = rows.to(tl.int64)
    x_row = x_ptr + m.to(tl.int64) * K
    acc_w = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for w0 in range(0, row_words, BLOCK_W):
        wi = w0 + tl.arange(0, BLOCK_W)
        w_ok = wi < row_words
        w = tl.load(
            w_ptr + rows64[:, None] * row_words + wi[None, :],
            mask=row_ok[:, None] & w_ok[None, :],
            other=0,
        )
        if X_SPLIT:  # one 8-byte x load a word, taken apart with tl.split
            x_at = (wi * 4)[:, None] + tl.arange(0, 4)[None, :]
            x4 = tl.load(x_row + x_at, mask=w_ok[:, None], other=0.0).to(tl.float32)
            if CONVERT == 1:
                x4 = x4 * 18446744073709551616.0  # 2^64
            even, odd = tl.split(tl.reshape(x4, (BLOCK_W, 2, 2)))
            x0, x2 = tl.split(even)
            x1, x3 = tl.split(odd)
            part = fp8_byte_f32(w, 0, CONVERT, SIGN_EXP_MANT) * x0[None, :]
            part += fp8_byte_f32(w, 1, CONVERT, SIGN_EXP_MANT) * x1[None, :]
            part += fp8_byte_f32(w, 2, CONVERT, SIGN_EXP_MANT) * x2[None, :]
            part += fp8_byte_f32(w, 3, CONVERT, SIGN_EXP_MANT) * x3[None, :]
        else:  # one 2-byte x load a code (L1 hits)
            part = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
            for b in tl.static_range(4):
                xb = tl.load(x_row + wi * 4 + b, mask=w_ok, other=0.0).to(tl.float32)
                if CONVERT == 1:
                    xb = xb * 18446744073709551616.0  # 2^64
                part += fp8_byte_f32(w, b, CONVERT, SIGN_EXP_MANT) * xb[None, :]
        if ONE_SCALE:
            acc_w += part
        else:  # BLOCK_W * 4 divides scale_bk: one scale per row for the tile
            s = tl.load(
                scale_ptr + (rows // scale_bn) * scale_cols + (w0 * 4) // scale_bk, mask=row_ok
            )
            acc += tl.sum(part, axis=1) * s
    if ONE_SCALE:
        acc = tl.sum(acc_w, axis=1) * tl.load(scale_ptr + rows // scale_bn, mask=row_ok)
    if CONVERT == 1:
        acc = acc * 72057594037927936.0  # 2^56: 2^120 / 2^64
    out = out_ptr + m.to(tl.int64) * N + rows
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok)


def int4_wide(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    config: Int4GemvConfig,
) -> torch.Tensor:
    """x [M, K] @ W^T through a wide int4 variant (quant_gemv's layout, groups of 32)."""
    m, k = x.shape
    n = packed.shape[0]
    words = packed.contiguous().view(torch.int32)  # [N, K/8]: K is a multiple of 32
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (m * triton.cdiv(n, config.block_n),)
    _int4_wide_kernel[grid](
        x.contiguous(), words, scale.contiguous(), bias.contiguous(), out, m, n, k, k // 8,
        k // 32, config.block_n, config.groups, _INT4_CONVERT[config.variant], config.x_split,
        num_warps=config.num_warps,
    )  # fmt: skip
    return out


def fp8_wide_fits(weight: torch.Tensor, scale_bk: int, scale_cols: int) -> bool:
    """Whether the wide fp8 GEMV takes this weight: rows of whole int32 words, and (block
    scales) K blocks of a multiple of 4 codes."""
    k = weight.shape[1]
    return k % 4 == 0 and (scale_cols == 1 or (scale_bk & -scale_bk) >= 4)


def fp8_wide(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, config: Fp8GemvConfig
) -> torch.Tensor:
    """x [M, K] @ W^T through a wide fp8 variant; scale [ceil(N/Bn), ceil(K/Bk)] fp32."""
    m, k = x.shape
    n = weight.shape[0]
    scale_bn = triton.cdiv(n, scale.shape[0])
    scale_bk = triton.cdiv(k, scale.shape[1])
    one_scale = scale.shape[1] == 1
    block_w = config.block_w if one_scale else min(config.block_w, (scale_bk & -scale_bk) // 4)
    words = weight.contiguous().view(torch.uint8).view(torch.int32)  # [N, K/4]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (m * triton.cdiv(n, config.block_n),)
    _fp8_wide_kernel[grid](
        x.contiguous(), words, scale.contiguous().float(), out, m, n, k, k // 4, scale_bn,
        scale_bk, scale.shape[1], config.block_n, block_w, _FP8_CONVERT[config.variant],
        one_scale, FP8_SIGN_EXP_MANT, config.x_split, num_warps=config.num_warps,
    )  # fmt: skip
    return out
