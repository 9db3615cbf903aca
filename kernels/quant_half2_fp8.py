"""Fp8Gemv.HALF2: the e4m3 decode GEMV in packed half2 arithmetic (issue 16).

kernels/quant_half2.py's scheme for e4m3 [N, K] weights: each thread holds every W row of its
tile for a 16-byte block of codes (K a multiple of 16), cvt.rn.f16x2.e4m3x2 turns each 16-bit
half of a word into an exact f16x2 pair, fma.rn.f16x2 multiplies it with (x[k], x[k+1]) (x
scaled by FP8_X_SCALE = 2^-10 and packed once per thread and block); per 16 codes two f16x2
accumulators, then fp32. 8 products of |q| <= 448 per fp16 lane: |x| < 2^14 cannot overflow.
Block scales (scale_bk a multiple of 16) are gathered per row and block of 16 codes, per
channel ones applied once at the end. PLAIN (the CPU interpreter): the same fp16 arithmetic.
PDL (config.pdl on sm_90+): as the int4 kernel, the first tile before the wait (gemv_pdl.py).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl
from troupe.kernels.gemv_pdl import GDC, pdl_mode, pdl_start, pdl_wait
from troupe.kernels.quant_gemv_config import Fp8GemvConfig
from troupe.kernels.quant_half2 import (
    LANE_REGS,
    LANES_TO_F32,
    device_sms,
    f16x2,
    finish_splits,
    fma16,
    lanes,
    launch_shape,
    words4,
    x_load,
    x_parts,
)

FP8_X_SCALE = tl.constexpr(2.0**-10)


def _fp8_asm() -> str:
    """PTX of 16 e4m3 codes: $1-$4 words, $5 + 2i, $6 + 2i word i's x pairs, $0 fp32."""
    lines = [
        "{",
        ".reg .b16 c0, c1;",
        ".reg .b32 h0, h1, a, b;",
        *LANE_REGS,
    ]
    for i in range(4):
        x = 5 + 2 * i
        lines += [
            f"mov.b32 {{c0, c1}}, ${1 + i};",
            "cvt.rn.f16x2.e4m3x2 h0, c0;",
            "cvt.rn.f16x2.e4m3x2 h1, c1;",
        ]
        if i == 0:
            lines += [f"mul.rn.f16x2 a, h0, ${x};", f"mul.rn.f16x2 b, h1, ${x + 1};"]
        else:
            lines += [f"fma.rn.f16x2 a, h0, ${x}, a;", f"fma.rn.f16x2 b, h1, ${x + 1}, b;"]
    return "\n".join(lines + LANES_TO_F32)


FP8_ASM = tl.constexpr(_fp8_asm())


@triton.jit
def _fp8_code(w, B: tl.constexpr):
    """Byte B of each int32 word as the e4m3 value in fp16 (exact)."""
    code = ((w >> (8 * B)) & 255).to(tl.uint8)
    return code.to(tl.float8e4nv, bitcast=True).to(tl.float32).to(tl.float16)


@triton.jit
def _fp8_word_plain(w, a_lo, a_hi, b_lo, b_hi, x0, x1, x2, x3):
    """One fp8 word's 4 products, fp16 rounding as the asm (a: bytes 0, 1; b: bytes 2, 3)."""
    a_lo = fma16(_fp8_code(w, 0), x0, a_lo)
    a_hi = fma16(_fp8_code(w, 1), x1, a_hi)
    b_lo = fma16(_fp8_code(w, 2), x2, b_lo)
    b_hi = fma16(_fp8_code(w, 3), x3, b_hi)
    return a_lo, a_hi, b_lo, b_hi


@triton.jit
def _x_pairs(x, Q: tl.constexpr, PLAIN: tl.constexpr):
    """A loaded quad x[E..E+3] scaled: pairs (E, E+1), (E+2, E+3) (f16x2 each, or lo, hi)."""
    x0, x1, x2, x3 = x_parts(x, Q)
    p01, h01 = f16x2(x0 * FP8_X_SCALE, x1 * FP8_X_SCALE, PLAIN)
    p23, h23 = f16x2(x2 * FP8_X_SCALE, x3 * FP8_X_SCALE, PLAIN)
    return p01, h01, p23, h23


@triton.jit
def _fp8_x4(xq, ok):
    """A block's 16 x values as 4 raw quads."""
    return x_load(xq, 0, ok), x_load(xq, 4, ok), x_load(xq, 8, ok), x_load(xq, 12, ok)


@triton.jit
def _fp8_block_dot(w, xa, xb, xc, xd, BLOCK_N: tl.constexpr, Q: tl.constexpr, PLAIN: tl.constexpr):
    """sum over each block of 16 codes of q * (x X_SCALE) (fp16 lanes -> fp32); x: the
    block's quads from _fp8_x4."""
    w0, w1, w2, w3 = words4(w, BLOCK_N, Q)
    p00, h00, p01, h01 = _x_pairs(xa, Q, PLAIN)
    p10, h10, p11, h11 = _x_pairs(xb, Q, PLAIN)
    p20, h20, p21, h21 = _x_pairs(xc, Q, PLAIN)
    p30, h30, p31, h31 = _x_pairs(xd, Q, PLAIN)
    if PLAIN:
        zero = tl.zeros((BLOCK_N, Q), dtype=tl.float16)
        a_lo, a_hi, b_lo, b_hi = zero, zero, zero, zero
        a_lo, a_hi, b_lo, b_hi = _fp8_word_plain(w0, a_lo, a_hi, b_lo, b_hi, p00, h00, p01, h01)
        a_lo, a_hi, b_lo, b_hi = _fp8_word_plain(w1, a_lo, a_hi, b_lo, b_hi, p10, h10, p11, h11)
        a_lo, a_hi, b_lo, b_hi = _fp8_word_plain(w2, a_lo, a_hi, b_lo, b_hi, p20, h20, p21, h21)
        a_lo, a_hi, b_lo, b_hi = _fp8_word_plain(w3, a_lo, a_hi, b_lo, b_hi, p30, h30, p31, h31)
        return lanes(a_lo, b_lo) + lanes(a_hi, b_hi)
    return tl.inline_asm_elementwise(
        FP8_ASM,
        "=r" + ",r" * 12,
        [
            w0, w1, w2, w3,
            p00[None, :], p01[None, :], p10[None, :], p11[None, :],
            p20[None, :], p21[None, :], p30[None, :], p31[None, :],
        ],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )  # fmt: skip


@triton.jit
def _fp8_tile(w_ptr, scale_ptr, rows64, rows_in, word, row_words, quad_in, scale_bn, scale_bk,
              scale_cols, ONE_SCALE: tl.constexpr):  # fmt: skip
    """W words [BLOCK_N, QUADS, 4] at blocks quad_in, and (block scales; 16 divides scale_bk)
    one scale per row and block of 16 codes (ONE_SCALE: a dummy 1)."""
    wi = quad_in[:, None] + word[None, :]
    w = tl.load(w_ptr + rows64[:, None, None] * row_words + wi[None, :, :])
    if ONE_SCALE:
        s = tl.full((1, 1), 1.0, tl.float32)
    else:
        s_at = (rows_in // scale_bn)[:, None] * scale_cols + ((quad_in * 4) // scale_bk)[None, :]
        s = tl.load(scale_ptr + s_at)
    return w, s


@triton.jit
def _fp8_acc(acc, w, s, x_row, quad, row_words, BLOCK_N: tl.constexpr, QUADS: tl.constexpr,
             ONE_SCALE: tl.constexpr, PLAIN: tl.constexpr):  # fmt: skip
    """acc plus the tile's sums: W words w, block scales s, at blocks `quad` of x's row."""
    xa, xb, xc, xd = _fp8_x4(x_row + quad * 4, quad < row_words)
    dot = _fp8_block_dot(w, xa, xb, xc, xd, BLOCK_N, QUADS, PLAIN)
    if ONE_SCALE:
        acc += dot
    else:
        acc += dot * s
    return acc


@triton.jit(do_not_specialize=["M"])
def _fp8_half2_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr,
    M, N, K, row_words, words_per_split, scale_bn, scale_bk, scale_cols,
    BLOCK_N: tl.constexpr, QUADS: tl.constexpr, ONE_SCALE: tl.constexpr, PLAIN: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    pid = tl.program_id(0)
    m, pid_n, pid_k = pid % M, pid // M, tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    # no load masks (quant_half2's int4 kernel says why): rows past N repeat row N - 1, blocks
    # past K the last one (x there is 0)
    rows_in = tl.minimum(rows, N - 1)
    rows64 = rows_in.to(tl.int64)
    word = tl.arange(0, 4)
    x_row = x_ptr + m.to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, QUADS), dtype=tl.float32)
    w_start = pid_k * words_per_split
    w_loop = w_start
    if PDL:  # the first tile and scales before the wait, x after (gemv_pdl.py)
        quad = w_start + tl.arange(0, QUADS) * 4
        w, s = _fp8_tile(w_ptr, scale_ptr, rows64, rows_in, word, row_words,
                         tl.minimum(quad, row_words - 4), scale_bn, scale_bk, scale_cols,
                         ONE_SCALE)  # fmt: skip
        if ONE_SCALE:
            s_row = tl.load(scale_ptr + rows_in // scale_bn)
        pdl_wait(PDL)
        acc = _fp8_acc(acc, w, s, x_row, quad, row_words, BLOCK_N, QUADS, ONE_SCALE, PLAIN)
        w_loop = w_start + 4 * QUADS
    for w0 in range(w_loop, w_start + words_per_split, 4 * QUADS):
        quad = w0 + tl.arange(0, QUADS) * 4  # first word of each block of 16 codes
        w, s = _fp8_tile(w_ptr, scale_ptr, rows64, rows_in, word, row_words,
                         tl.minimum(quad, row_words - 4), scale_bn, scale_bk, scale_cols,
                         ONE_SCALE)  # fmt: skip
        acc = _fp8_acc(acc, w, s, x_row, quad, row_words, BLOCK_N, QUADS, ONE_SCALE, PLAIN)
    y = tl.sum(acc, axis=1) * (1.0 / FP8_X_SCALE)
    if ONE_SCALE:
        if PDL:
            y = y * s_row
        else:
            y = y * tl.load(scale_ptr + rows_in // scale_bn)
    out = out_ptr + (pid_k.to(tl.int64) * M + m) * N + rows
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=row_ok)


def fp8_half2_fits(weight: torch.Tensor, scale_bk: int, scale_cols: int) -> bool:
    """Whether Fp8Gemv.HALF2 takes this weight: rows of whole blocks of 16 codes, and (block
    scales) K blocks of a multiple of 16 codes."""
    return weight.shape[1] % 16 == 0 and (scale_cols == 1 or scale_bk % 16 == 0)


def fp8_half2(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, config: Fp8GemvConfig
) -> torch.Tensor:
    """x [M, K] @ W^T through Fp8Gemv.HALF2; scale [ceil(N/Bn), ceil(K/Bk)] fp32."""
    m, k = x.shape
    n = weight.shape[0]
    scale_bn = triton.cdiv(n, scale.shape[0])
    scale_bk = triton.cdiv(k, scale.shape[1])
    assert config.block_w % 4 == 0, f"block_w must be a multiple of 4, got {config.block_w}"
    quads = config.block_w // 4
    words = weight.contiguous().view(torch.uint8).view(torch.int32)  # [N, K/4]
    chunks = triton.cdiv(k // 4, config.block_w)
    block_n, split = launch_shape(
        config.block_n, config.k_splits, n, m, chunks, device_sms(x.device)
    )
    tiles = m * triton.cdiv(n, block_n)
    per_split = triton.cdiv(chunks, split) * config.block_w
    dtype = torch.float32 if split > 1 else x.dtype
    part = torch.empty(split, m, n, dtype=dtype, device=x.device)
    pdl = pdl_mode(config.pdl, x.device)
    _fp8_half2_kernel[(tiles, split)](
        x.contiguous(), words, scale.contiguous().float(), part, m, n, k, k // 4, per_split,
        scale_bn, scale_bk, scale.shape[1], block_n, quads, scale.shape[1] == 1,
        x.device.type != "cuda", pdl, num_warps=config.num_warps, launch_pdl=pdl == GDC,
    )  # fmt: skip
    return finish_splits(part, x)
