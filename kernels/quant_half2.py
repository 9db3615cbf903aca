"""Decode GEMVs in packed half2 arithmetic (PTX through tl.inline_asm_elementwise), issue 16.

The byte GEMVs (quant_gemv.py) spend ~15 instructions per weight byte on an H200 (converts,
shared-memory x and reductions every iteration); streaming at ~70% of copy needs <= ~5. Here
each thread holds every W row of its tile for its K columns (a tile [BLOCK_N, 32 x warps
column blocks, 4 int32 words]: 16 contiguous bytes per thread and row, so the x values it
needs are loaded and packed once and serve all BLOCK_N rows), a 16-byte block of one row is
multiplied out in one asm block on f16x2 pairs, and the products are summed per thread in
fp32; one cross-thread sum at the end.

    Int4Gemv.HALF2  16 bytes = one Q4_0 group of 32 (byte j: element j low, j + 16 high). For
        a word of bytes 4i..4i+3, w & 0x000F000F holds elements (4i, 4i+2) in its two 16-bit
        halves; OR 0x4C004C00 makes them the fp16 values 16 + q/64 (16: ulp 2^-6), one
        sub.f16x2 gives q/64 exactly. Bits 4-7 with 0x3C003C00 (1.0: ulp 2^-10): elements
        (4i+16, 4i+18); the word shifted right 8 gives (4i+1, 4i+3) and (4i+17, 4i+19). Per
        word: 1 shift, 4 lop3, 4 sub, 4 fma.f16x2 with the matching x pairs; two f16x2
        accumulators per group, converted to fp32 at its end: y += s (x . q) + b sum(x).
    Fp8Gemv.HALF2  (quant_half2_fp8.py) 16 e4m3 codes through cvt.rn.f16x2.e4m3x2 and
        fma.rn.f16x2, on the shared helpers below.

x is loaded as fp32 (fp8: scaled by 2^-10, exact) and packed into f16x2 pairs once per thread
and column block. fp16 accumulation bounds: int4 16 products of q/64 <= 15/64 per lane, fp8 8
of |q| <= 448, so any |x| < 2^14 cannot overflow; the powers of two are undone in fp32. fp16 rounds each partial sum to 11 bits: ~1e-3 of max |y| in all (GPU test bound 1e-2).
K may be split (k_splits): fp32 partials [S, M, N] summed after (no atomics). pdl: launched with
programmatic dependent launch, the first W tile loaded before the wait (kernels/gemv_pdl.py).
TRITON_INTERPRET=1 cannot run PTX: PLAIN (the CPU) runs the same fp16 arithmetic in Triton.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl
from troupe.kernels.gemv_pdl import GDC, pdl_mode, pdl_start, pdl_wait
from troupe.kernels.quant_gemv_config import Int4GemvConfig

INT4_Q_SCALE = tl.constexpr(2.0**-6)  # the asm's nibbles are q/64 (x stays unscaled)


@triton.jit
def words4(w, BLOCK_N: tl.constexpr, Q: tl.constexpr):
    """[BLOCK_N, Q, 4] int32 -> its four [BLOCK_N, Q] words (in-thread: 16-byte vectors)."""
    even, odd = tl.split(tl.reshape(w, (BLOCK_N, Q, 2, 2)))
    w0, w2 = tl.split(even)
    w1, w3 = tl.split(odd)
    return w0, w1, w2, w3


@triton.jit
def x_load(xq, E: tl.constexpr, ok):
    """x[E..E+3] of each column block [Q, 4] (one 8-byte load; ok: the block is in K)."""
    return tl.load(xq[:, None] + E + tl.arange(0, 4)[None, :], mask=ok[:, None], other=0.0)


@triton.jit
def x_parts(x, Q: tl.constexpr):
    """A loaded [Q, 4] quad of x as four [Q] fp32."""
    even, odd = tl.split(tl.reshape(x.to(tl.float32), (Q, 2, 2)))
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def f16x2(lo, hi, PLAIN: tl.constexpr):
    """(lo, hi) as one f16x2 int32 and a dummy, or (PLAIN) as two fp16."""
    if PLAIN:
        return lo.to(tl.float16), hi.to(tl.float16)
    packed = tl.inline_asm_elementwise(
        "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi], dtype=tl.int32, is_pure=True, pack=1
    )
    return packed, 0


@triton.jit
def _x_quads(x, Q: tl.constexpr, PLAIN: tl.constexpr):
    """A loaded quad x[E..E+3]'s pairs (E, E+2) and (E+1, E+3) (f16x2 each, or lo, hi) and
    their fp32 sum."""
    x0, x1, x2, x3 = x_parts(x, Q)
    p02, h02 = f16x2(x0, x2, PLAIN)
    p13, h13 = f16x2(x1, x3, PLAIN)
    return p02, h02, p13, h13, x0 + x1 + x2 + x3


@triton.jit
def fma16(q, x, acc):
    """acc + q x rounded once to fp16 (fma.rn.f16x2 on one lane; fp16 products are exact)."""
    return (q.to(tl.float32) * x.to(tl.float32) + acc.to(tl.float32)).to(tl.float16)


@triton.jit
def lanes(acc_a, acc_b):
    """Two f16 accumulators of one lane, added in fp16 (add.f16x2), as fp32."""
    return (acc_a.to(tl.float32) + acc_b.to(tl.float32)).to(tl.float16).to(tl.float32)


@triton.jit
def _nib(w, SHIFT: tl.constexpr):
    """Bits SHIFT..SHIFT+3 of each word as q/64 in fp16 (exact), as the asm makes them."""
    return (((w >> SHIFT) & 15).to(tl.float32) * INT4_Q_SCALE).to(tl.float16)


@triton.jit
def _int4_word_plain(w, a_lo, a_hi, b_lo, b_hi, x0, x1, x2, x3, x4, x5, x6, x7):
    """One int4 word's 8 products into the accumulators' lanes (a: bits 0-3 and 8-11 of each
    half, b: bits 4-7 and 12-15), fp16 rounding as the asm; x: lo, hi of the 4 pairs."""
    a_lo = fma16(_nib(w, 0), x0, a_lo)
    a_hi = fma16(_nib(w, 16), x1, a_hi)
    b_lo = fma16(_nib(w, 4), x2, b_lo)
    b_hi = fma16(_nib(w, 20), x3, b_hi)
    a_lo = fma16(_nib(w, 8), x4, a_lo)
    a_hi = fma16(_nib(w, 24), x5, a_hi)
    b_lo = fma16(_nib(w, 12), x6, b_lo)
    b_hi = fma16(_nib(w, 28), x7, b_hi)
    return a_lo, a_hi, b_lo, b_hi


# The end of both half2 PTX dots (here and quant_half2_fp8.py): the two f16x2 accumulators a and
# b added, the sum's two fp16 lanes to fp32 and their sum into $0; LANE_REGS declares the lanes.
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
    """PTX of one int4 group: $1-$4 words, $5 + 4i .. $8 + 4i word i's x pairs, $0 fp32."""
    lines = [
        "{",
        ".reg .b32 cm, ch, h, s, a, b;",
        *LANE_REGS,
        "mov.b32 cm, 0x4C004C00;",
        "mov.b32 ch, 0x3C003C00;",
        "mov.b32 a, 0;",
        "mov.b32 b, 0;",
    ]
    for i in range(4):
        word, x = f"${1 + i}", 5 + 4 * i
        for src, pair in ((word, x), ("s", x + 2)):
            if src == "s":
                lines.append(f"shr.u32 s, {word}, 8;")
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


@triton.jit
def _int4_x8(xq, ok):
    """A group's 32 x values as 8 raw quads, in the order _int4_group_dot takes them."""
    return (
        x_load(xq, 0, ok), x_load(xq, 16, ok), x_load(xq, 4, ok), x_load(xq, 20, ok),
        x_load(xq, 8, ok), x_load(xq, 24, ok), x_load(xq, 12, ok), x_load(xq, 28, ok),
    )  # fmt: skip


@triton.jit
def _int4_group_dot(
    w, xa, xb, xc, xd, xe, xf, xg, xh, BLOCK_N: tl.constexpr, Q: tl.constexpr, PLAIN: tl.constexpr
):
    """sum over each group of 32 of q/64 * x (fp16 lanes -> fp32), and sum(x) (fp32); x: the
    group's quads from _int4_x8."""
    w0, w1, w2, w3 = words4(w, BLOCK_N, Q)
    # word i's pairs: (4i, 4i+2) (4i+16, 4i+18) (4i+1, 4i+3) (4i+17, 4i+19), from 8-byte loads
    p00, h00, p02, h02, s0 = _x_quads(xa, Q, PLAIN)
    p01, h01, p03, h03, s1 = _x_quads(xb, Q, PLAIN)
    p10, h10, p12, h12, s2 = _x_quads(xc, Q, PLAIN)
    p11, h11, p13, h13, s3 = _x_quads(xd, Q, PLAIN)
    p20, h20, p22, h22, s4 = _x_quads(xe, Q, PLAIN)
    p21, h21, p23, h23, s5 = _x_quads(xf, Q, PLAIN)
    p30, h30, p32, h32, s6 = _x_quads(xg, Q, PLAIN)
    p31, h31, p33, h33, s7 = _x_quads(xh, Q, PLAIN)
    xs = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7
    if PLAIN:
        zero = tl.zeros((BLOCK_N, Q), dtype=tl.float16)
        a_lo, a_hi, b_lo, b_hi = zero, zero, zero, zero
        a_lo, a_hi, b_lo, b_hi = _int4_word_plain(
            w0, a_lo, a_hi, b_lo, b_hi, p00, h00, p01, h01, p02, h02, p03, h03
        )
        a_lo, a_hi, b_lo, b_hi = _int4_word_plain(
            w1, a_lo, a_hi, b_lo, b_hi, p10, h10, p11, h11, p12, h12, p13, h13
        )
        a_lo, a_hi, b_lo, b_hi = _int4_word_plain(
            w2, a_lo, a_hi, b_lo, b_hi, p20, h20, p21, h21, p22, h22, p23, h23
        )
        a_lo, a_hi, b_lo, b_hi = _int4_word_plain(
            w3, a_lo, a_hi, b_lo, b_hi, p30, h30, p31, h31, p32, h32, p33, h33
        )
        dot = lanes(a_lo, b_lo) + lanes(a_hi, b_hi)
    else:
        dot = tl.inline_asm_elementwise(
            INT4_ASM,
            "=r" + ",r" * 20,
            [
                w0, w1, w2, w3,
                p00[None, :], p01[None, :], p02[None, :], p03[None, :],
                p10[None, :], p11[None, :], p12[None, :], p13[None, :],
                p20[None, :], p21[None, :], p22[None, :], p23[None, :],
                p30[None, :], p31[None, :], p32[None, :], p33[None, :],
            ],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )  # fmt: skip
    return dot, xs


@triton.jit
def _int4_tile(w_ptr, scale_ptr, bias_ptr, rows64, word, row_words, row_groups, g_in):
    """W words [BLOCK_N, GROUPS, 4], scales and biases [BLOCK_N, GROUPS] (fp32) at groups g_in.
    2-byte scale loads in the words' layout (vectorized along g they would go through shared
    memory to reach it)."""
    w = tl.load(
        w_ptr + rows64[:, None, None] * row_words + (g_in * 4)[None, :, None] + word[None, None, :]
    )
    sb_off = rows64[:, None] * row_groups + tl.max_contiguous(g_in, 1)[None, :]
    s = tl.load(scale_ptr + sb_off).to(tl.float32)
    b = tl.load(bias_ptr + sb_off).to(tl.float32)
    return w, s, b


@triton.jit
def _int4_acc(acc, w, s, b, x_row, g, row_groups, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
              PLAIN: tl.constexpr):  # fmt: skip
    """acc plus the tile's sums: W words w, scales s, biases b at groups g of x's row."""
    xa, xb, xc, xd, xe, xf, xg, xh = _int4_x8(x_row + g * 32, g < row_groups)
    dot, xs = _int4_group_dot(w, xa, xb, xc, xd, xe, xf, xg, xh, BLOCK_N, GROUPS, PLAIN)
    acc += dot * s + b * (xs * INT4_Q_SCALE)[None, :]  # Q_SCALE folded out at the end
    return acc


@triton.jit(do_not_specialize=["M"])
def _int4_half2_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K, row_words, row_groups, groups_per_split,
    BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, PLAIN: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    pid = tl.program_id(0)
    m, pid_n, pid_k = pid % M, pid // M, tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    # no load masks on W, scales, biases (a mask per row costs a predicate each, and ptxas,
    # out of predicates, serializes the loads): rows past N repeat row N - 1 (not stored),
    # groups past K repeat the last one (x there is 0)
    rows64 = tl.minimum(rows, N - 1).to(tl.int64)
    word = tl.arange(0, 4)
    x_row = x_ptr + m.to(tl.int64) * K
    acc = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)
    g_start = pid_k * groups_per_split
    g_loop = g_start
    if PDL:  # the first tile before the wait, its x after (gemv_pdl.py)
        g = g_start + tl.arange(0, GROUPS)
        w, s, b = _int4_tile(
            w_ptr, scale_ptr, bias_ptr, rows64, word, row_words, row_groups,
            tl.minimum(g, row_groups - 1),
        )  # fmt: skip
        pdl_wait(PDL)
        acc = _int4_acc(acc, w, s, b, x_row, g, row_groups, BLOCK_N, GROUPS, PLAIN)
        g_loop = g_start + GROUPS
    for g0 in range(g_loop, g_start + groups_per_split, GROUPS):
        g = g0 + tl.arange(0, GROUPS)
        w, s, b = _int4_tile(
            w_ptr, scale_ptr, bias_ptr, rows64, word, row_words, row_groups,
            tl.minimum(g, row_groups - 1),
        )  # fmt: skip
        acc = _int4_acc(acc, w, s, b, x_row, g, row_groups, BLOCK_N, GROUPS, PLAIN)
    out = out_ptr + (pid_k.to(tl.int64) * M + m) * N + rows
    y = tl.sum(acc, axis=1) * (1.0 / INT4_Q_SCALE)
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=row_ok)


def launch_shape(
    block_n: int, configured: int, n: int, m: int, chunks: int, sms: int | None
) -> tuple[int, int]:
    """(W rows per program, K splits): the config's, splits cut to the K chunks there are; or
    (k_splits 0, a GPU of `sms` SMs; None: the CPU) about four programs per SM: block_n halved (down to 2) while even
    splitting K into every chunk gives under three, then enough splits (whole chunks each)."""
    if configured > 0 or sms is None:
        return block_n, max(1, min(configured, chunks))
    want = 4 * sms
    while block_n > 2 and m * triton.cdiv(n, block_n) * chunks < 3 * sms:
        block_n //= 2
    split = max(1, min(chunks, triton.cdiv(want, m * triton.cdiv(n, block_n))))
    while chunks % split:
        split -= 1
    return block_n, int(split)


def device_sms(device: torch.device) -> int | None:
    """The GPU's SM count (None: not a GPU)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def finish_splits(part: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return part[0] if part.shape[0] == 1 else part.sum(0).to(x.dtype)


def int4_half2(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    config: Int4GemvConfig,
) -> torch.Tensor:
    """x [M, K] @ W^T for quant_gemv's int4 layout (groups of 32) through Int4Gemv.HALF2."""
    m, k = x.shape
    n = packed.shape[0]
    groups = k // 32
    words = packed.contiguous().view(torch.int32)  # [N, K/8]
    chunks = triton.cdiv(groups, config.groups)
    block_n, split = launch_shape(
        config.block_n, config.k_splits, n, m, chunks, device_sms(x.device)
    )
    tiles = m * triton.cdiv(n, block_n)
    per_split = triton.cdiv(chunks, split) * config.groups
    dtype = torch.float32 if split > 1 else x.dtype
    part = torch.empty(split, m, n, dtype=dtype, device=x.device)
    pdl = pdl_mode(config.pdl, x.device)
    _int4_half2_kernel[(tiles, split)](
        x.contiguous(), words, scale.contiguous(), bias.contiguous(), part, m, n, k, k // 8,
        groups, per_split, block_n, config.groups, x.device.type != "cuda", pdl,
        num_warps=config.num_warps, launch_pdl=pdl == GDC,
    )  # fmt: skip
    return finish_splits(part, x)
