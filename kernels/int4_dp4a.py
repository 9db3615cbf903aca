"""The int4 decode GEMV's integer form (kernels/quant_int4.py, Int4ColsGemv.x_int8): x rounded
to int8 per group of 32 (llama.cpp's Q8_1 for activations; the CPU kernel gpu/cpu_q4dot.c rounds
x per group too), then each group's 32 products as integer dot products of four bytes (dp4a).

    x_codes   a tile's groups of x in a layout of their own ([G, 8, 4], a few values a thread):
              d = max|x| / 127, codes round(x / d) (half up) packed four a word (word k:
              elements 4k..4k+3), the exact fp32 sum of x; the words pass an impure PTX move
              so the layout pass cannot rematerialise the rounding in the weight tile's layout
              (where every thread would redo it for each of its groups), then split into the
              eight [G, 1] words each column's group takes
    group_dot one group and column: words w0..w3 (byte j of word i: element 4i + j in its low
              nibble, 4i + j + 16 in its high one) against the codes: per word one and, one
              shift + and (shared by the rows of a multi-row program), two dp4a.u32.s32; the
              int32 sum as fp32 (exact: |sum| < 2^16)

Against the f16x2 PTX (kernels/half2_ptx.INT4_ASM, 14 instructions a word plus x's pairs made
per thread and group) this issues ~5 a word; the error is the rounding of x, ~1% of max |y| on
random data (fp16 partial sums: ~0.1%). PLAIN (TRITON_INTERPRET=1, no PTX) computes the same
integers.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _dp4a_asm() -> str:
    """$1-$4 the group's low nibbles (word i: elements 4i..4i+3, a byte each), $5-$8 its high
    ones (16 + 4i..), $9-$12 the codes of elements 0-15, $13-$16 of 16-31; $0 the fp32 of
    the int32 sum."""
    lines = ["{", ".reg .b32 s, t;"]
    for i in range(4):
        at = ", s;" if i else ", 0;"
        lines.append(f"dp4a.u32.s32 s, ${1 + i}, ${9 + i}" + at)
        lines.append(f"dp4a.u32.s32 t, ${5 + i}, ${13 + i}" + at.replace("s;", "t;"))
    return "\n".join([*lines, "add.s32 s, s, t;", "cvt.rn.f32.s32 $0, s;", "}"])


DP4A_ASM = tl.constexpr(_dp4a_asm())


@triton.jit
def _pin(words, PLAIN: tl.constexpr):
    """The words unchanged, through an impure move on the GPU (module docstring)."""
    if PLAIN:
        return words
    return tl.inline_asm_elementwise(
        "mov.b32 $0, $1;", "=r,r", [words], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _halves(p):
    """The last axis's even and odd entries."""
    return tl.split(tl.reshape(p, [p.shape[0], p.shape[1] // 2, 2]))


@triton.jit
def x_codes(x_row, g, ok, PLAIN: tl.constexpr):
    """x's groups g (ok: inside K) as codes: the words of elements 0-15 and of 16-31 ([G, 1]
    each), d [G, 1] and the sums [G, 1]."""
    k = tl.arange(0, 8)
    t = tl.arange(0, 4)
    at = g[:, None, None] * 32 + k[None, :, None] * 4 + t[None, None, :]
    x = tl.load(x_row + at, mask=ok[:, None, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), axis=2), axis=1)
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    q = tl.floor(x * inv[:, None, None] + 0.5).to(tl.int32)
    words = _pin(tl.sum((q & 255) << (8 * t)[None, None, :], axis=2), PLAIN)  # [G, 8]
    even, odd = _halves(words)
    e0, e2 = _halves(even)  # words 0, 4 and 2, 6
    o1, o3 = _halves(odd)  # 1, 5 and 3, 7
    l0, h0 = _halves(e0)
    l2, h2 = _halves(e2)
    l1, h1 = _halves(o1)
    l3, h3 = _halves(o3)
    d = (amax * (1.0 / 127.0))[:, None]
    total = tl.sum(tl.sum(x, axis=2), axis=1)[:, None]
    return l0, l1, l2, l3, h0, h1, h2, h3, d, total


@triton.jit
def _plain_word(w, lo, hi):
    """Word w's 8 products with its codes' words lo, hi, in int32 (the interpreter's path)."""
    dot = tl.zeros(w.shape, dtype=tl.int32)
    for j in tl.static_range(4):
        x_lo = (lo << (24 - 8 * j)) >> 24  # byte j, sign-extended
        x_hi = (hi << (24 - 8 * j)) >> 24
        dot += ((w >> (8 * j)) & 15) * x_lo + ((w >> (8 * j + 4)) & 15) * x_hi
    return dot


@triton.jit
def _nibbles(w):
    """A word's low and high nibbles as bytes: (w & 0x0F0F0F0F, w >> 4 & 0x0F0F0F0F). Outside
    the PTX, so the multi-row GEMV's rows share them."""
    return w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F


@triton.jit
def group_dot(w0, w1, w2, w3, l0, l1, l2, l3, h0, h1, h2, h3, PLAIN: tl.constexpr):
    """Each column's sum over the group of nibble x code, as fp32 [G, BN]."""
    if PLAIN:
        dot = _plain_word(w0, l0, h0) + _plain_word(w1, l1, h1)
        dot += _plain_word(w2, l2, h2) + _plain_word(w3, l3, h3)
        return dot.to(tl.float32)
    a0, b0 = _nibbles(w0)
    a1, b1 = _nibbles(w1)
    a2, b2 = _nibbles(w2)
    a3, b3 = _nibbles(w3)
    return tl.inline_asm_elementwise(
        DP4A_ASM,
        "=r" + ",r" * 16,
        [a0, a1, a2, a3, b0, b1, b2, b3, l0, l1, l2, l3, h0, h1, h2, h3],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


def x_int8_reference(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the integer form sees it, in fp32: each group of 32 rounded half up to
    d * round(x / d), d = max|x| / 127 (torch, for tests; the kernel takes the biases' sums of x
    unrounded)."""
    g = x.float().reshape(x.shape[0], -1, 32)
    amax = g.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    codes = torch.floor(g * inv + 0.5)
    return (codes * (amax * (1.0 / 127.0))).reshape(x.shape)
