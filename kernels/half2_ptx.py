"""The PTX blocks of the quantized decode GEMVs (kernels/quant_int4.py, quant_fp8.py): packed
f16x2 arithmetic through tl.inline_asm_elementwise, one block per (column, group of codes).
tests/kernels/test_quant_ptx.py runs them in a small emulator on the CPU (TRITON_INTERPRET=1
cannot run PTX; the kernels' PLAIN path sums the same products in fp32 there).

    INT4_ASM  one Q4_0 group of 32 (4 words: byte j holds element j low, j + 16 high): the
              word's bytes permuted (b0, b2, b1, b3); w & 0x000F000F | 0x4C004C00 is the fp16
              pair 16 + q/64 of elements (4i, 4i+1) (ulp 2^-6: exact), one sub.f16x2 leaves
              q/64; bits 4-7 with 1.0 (ulp 2^-10) the elements (4i+16, 4i+17); the word >> 8
              the next two pairs. Per word: prmt, shr, 4 lop3, 4 sub, 4 fma.f16x2 with x's
              adjacent pairs. 16 products of q/64 <= 15/64 per fp16 lane: |x| < 2^14 is safe.
    FP8_ASM   16 e4m3 codes (4 words, in order): cvt.rn.f16x2.e4m3x2 per 16-bit half (exact),
              fma.rn.f16x2 with the pair (x[k], x[k+1]) (x scaled by 2^-10 by the caller: 8
              products of |q| <= 448 per lane, |x| < 2^14 is safe).

Both keep two f16x2 accumulators and end in fp32 (LANES_TO_F32); fp16 rounds each partial sum
to 11 bits: ~1e-3 of max |y| in all (the GPU tests' bound: 1e-2).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton.language as tl

# The end of both blocks: the two f16x2 accumulators a and b added, the sum's two fp16 lanes to
# fp32 and their sum into $0; LANE_REGS declares the lanes.
LANE_REGS = [".reg .f16 l, u;", ".reg .f32 fl, fu;"]
LANES_TO_F32 = [
    "add.f16x2 a, a, b;",
    "mov.b32 {l, u}, a;",
    "cvt.f32.f16 fl, l;",
    "cvt.f32.f16 fu, u;",
    "add.f32 $0, fl, fu;",
    "}",
]


def _int4_asm() -> str:
    """PTX of one group and column: $1-$4 its words, $5 + 4i .. $8 + 4i word i's x pairs
    (4i, 4i+1), (4i+16, 4i+17), (4i+2, 4i+3), (4i+18, 4i+19) as f16x2; $0 the fp32 sum."""
    lines = [
        "{",
        ".reg .b32 cm, ch, h, s, t, a, b;",
        *LANE_REGS,
        "mov.b32 cm, 0x4C004C00;",
        "mov.b32 ch, 0x3C003C00;",
        "mov.b32 a, 0;",
        "mov.b32 b, 0;",
    ]
    for i in range(4):
        x = 5 + 4 * i
        lines.append(f"prmt.b32 t, ${1 + i}, 0, 0x3120;")  # bytes (b0, b2, b1, b3)
        for src, pair in (("t", x), ("s", x + 2)):
            if src == "s":
                lines.append("shr.u32 s, t, 8;")
            lines += [
                f"lop3.b32 h, {src}, 0x000F000F, cm, 0xEA;",  # (src & mask) | magic
                "sub.f16x2 h, h, cm;",
                f"fma.rn.f16x2 a, h, ${pair}, a;",
                f"lop3.b32 h, {src}, 0x00F000F0, ch, 0xEA;",
                "sub.f16x2 h, h, ch;",
                f"fma.rn.f16x2 b, h, ${pair + 1}, b;",
            ]
    return "\n".join(lines + LANES_TO_F32)


INT4_ASM = tl.constexpr(_int4_asm())


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
