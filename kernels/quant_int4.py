"""4-bit weights in the GPU's column layout, and the Triton matmuls that read it (issue 16).

    Int4Cols   words [K/8, N] int32: column n's word r is bytes 4r..4r+3 of the weight row n in
               Q4_0 nibble order (per group of 32: byte j holds element j low, j + 16 high);
               scale, bias [K/32, N] fp16: w[n, k] = scale[g, n] q + bias[g, n], g = k // 32

Row-major packing ([N, K/2], gpu/gguf_quant.Int4Blocks) made every decode GEMV program re-read
x for each few W rows it held; here a thread holds adjacent output columns of one group, the
threads of a warp share the group, and x is one broadcast load per warp (x / W bytes moved per
program: 1/32 at 128 columns, 1 before).

    decode (GEMV, M < INT4_GEMM_MIN_ROWS, or up to Int4ColsGemv.max_rows <= 4)  grid (column
        blocks, K splits, groups of rows of x); a program's weight tiles serve its rows. Each
        group's 4 words per column are multiplied out in one PTX block (kernels/half2_ptx.
        INT4_ASM: f16x2 pairs of q/64, x's pairs adjacent elements, one bf16x2 word each;
        other dtypes load x by element), fp32 per group:
            y[n] = sum_g scale[g, n] (x_g . q_g) + bias[g, n] sum(x_g)
        K splits write fp32 partials [S, M, N]; the split that counts itself in last
        (kernels/arrival.py) sums them in split order, so the result does not depend on
        timing and no second kernel runs (gemv_launch: where one row's K fits 128 groups,
        narrow programs over the whole of K instead of splits). TRITON_INTERPRET=1 cannot
        run PTX: PLAIN (the CPU) sums the same products in fp32. Int4ColsGemv.x_int8: x
        rounded to int8 per group and dp4a instead (kernels/int4_dp4a.py).
    more rows (GEMM)  kernels/quant_int4_gemm.py.

pdl (GEMV): programmatic dependent launch (kernels/gemv_pdl.py): the first tile's words,
scales and biases are loaded before griddepcontrol.wait, x after.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from troupe.kernels.arrival import gemv_grid, split_buffers, store_or_merge
from troupe.kernels.gemv_pdl import GDC, pdl_mode, pdl_start, pdl_wait
from troupe.kernels.half2_ptx import INT4_ASM
from troupe.kernels.int4_dp4a import group_dot, x_codes
from troupe.kernels.quant_int4_gemm import int4_cols_gemm

INT4_GEMM_MIN_ROWS = 2
GEMV_ROWS = 4  # the most rows of x one GEMV program takes
Q_SCALE = tl.constexpr(2.0**-6)  # the PTX's nibbles are q/64


@dataclass(frozen=True)
class Int4Cols:
    """A 4-bit weight [N, K] in the column layout above (on the GPU, or the CPU in tests)."""

    words: torch.Tensor  # [K/8, N] int32
    scale: torch.Tensor  # [K/32, N] fp16
    bias: torch.Tensor  # [K/32, N] fp16

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.words.shape[1]), int(self.words.shape[0]) * 8

    @staticmethod
    def from_rows(packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> Int4Cols:
        """From Int4Blocks' row layout: packed [N, K/2] uint8, scale and bias [N, K/32]."""
        words = packed.contiguous().view(torch.int32).t().contiguous()
        return Int4Cols(words, scale.t().contiguous().half(), bias.t().contiguous().half())

    def rows(self, index: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Back to the row layout (packed, scale, bias), of rows `index` only when given."""
        words, scale, bias = self.words, self.scale, self.bias
        if index is not None:
            words, scale, bias = words[:, index], scale[:, index], bias[:, index]
        packed = words.t().contiguous().view(torch.uint8)
        return packed, scale.t().contiguous(), bias.t().contiguous()


@dataclass(frozen=True)
class Int4ColsGemv:
    """The decode GEMV's launch: output columns per program (a multiple of 128; gemv_launch
    may halve them, or take 32 over the whole of K), groups of 32 per iteration, warps,
    programs per SM wanted (K is split to reach it), PDL, and up to how many rows of x it
    takes (each program up to 4 of them: its weight tiles loaded once, the PTX dot run per
    row; more rows go to the GEMM)."""

    block_n: int = 128  # the best of an H200 sweep (ops/quant_cols_sweep.py)
    groups: int = 32
    num_warps: int = 8
    waves: int = 2
    pdl: bool = True
    max_rows: int = 1
    # One row a program and K split at the width above, but K at most this many groups: 32
    # columns a program over the whole of K in one iteration instead (no partials, no merge;
    # gemv_launch). 0: never.
    whole_k_groups: int = 128
    # x rounded to int8 per group and dp4a (kernels/int4_dp4a.py) instead of the f16x2 PTX.
    # H200, Llama-3.1-8B at one row: faster on o and qkv alone, 17% slower over the step
    # (docs/benchmarks.md, session 42).
    x_int8: bool = False

    def __post_init__(self) -> None:
        assert 1 <= self.max_rows <= GEMV_ROWS, f"max_rows {self.max_rows}: 1 to {GEMV_ROWS}"
        assert self.whole_k_groups & (self.whole_k_groups - 1) == 0, "a power of 2, or 0"


INT4_COLS_GEMV = Int4ColsGemv()
# 2-3 rows: the GEMV over several rows, its tiles loaded once (0.25-0.33 warp instructions a
# weight byte on sm_90 against the GEMM's 0.70). H100, Llama-3.1-8B chain (quant_bench,
# session 39): 1.60x / 1.50x bf16 at 2 / 3 rows against the GEMM's 1.23x; at 4 rows 1.11x, so
# 4 rows and more take the GEMM.
INT4_ROWS_GEMV = Int4ColsGemv(groups=8, max_rows=3, whole_k_groups=0)


@triton.jit
def _x_pair(x_row, g, J: tl.constexpr, ok):
    """x[32 g + 2J], x[32 g + 2J + 1] per group g: as f16x2 (one int32), and their fp32 sum."""
    if x_row.dtype.element_ty == tl.bfloat16:
        u = tl.load(x_row.to(tl.pointer_type(tl.int32)) + g * 16 + J, mask=ok, other=0)
        lo = (u << 16).to(tl.float32, bitcast=True)
        hi = (u & -65536).to(tl.float32, bitcast=True)
    else:
        lo = tl.load(x_row + g * 32 + 2 * J, mask=ok, other=0.0).to(tl.float32)
        hi = tl.load(x_row + g * 32 + 2 * J + 1, mask=ok, other=0.0).to(tl.float32)
    p = tl.inline_asm_elementwise(
        "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi], dtype=tl.int32, is_pure=True, pack=1
    )
    return p[:, None], (lo + hi)[:, None]


@triton.jit
def _plain_word(w, x_row, g, WORD: tl.constexpr, ok):
    """Word WORD of each group times its 8 x values, in fp32 (the interpreter's path): byte j holds
    element 4 WORD + j (low nibble) and 4 WORD + j + 16 (high)."""
    dot = tl.zeros(w.shape, dtype=tl.float32)
    xs = tl.zeros((w.shape[0], 1), dtype=tl.float32)
    for j in tl.static_range(4):
        x_lo = tl.load(x_row + g * 32 + 4 * WORD + j, mask=ok, other=0.0).to(tl.float32)[:, None]
        x_hi = tl.load(x_row + g * 32 + 4 * WORD + j + 16, mask=ok, other=0.0).to(tl.float32)
        dot += ((w >> (8 * j)) & 15).to(tl.float32) * x_lo
        dot += ((w >> (8 * j + 4)) & 15).to(tl.float32) * x_hi[:, None]
        xs += x_lo + x_hi[:, None]
    return dot * Q_SCALE, xs


@triton.jit
def _tile(w_ptr, s_ptr, b_ptr, cols, N, row_groups, g):
    """The words [GB, BN] x 4, scales, biases (fp32) of groups g (past K: the last group)."""
    gc = tl.minimum(g, row_groups - 1).to(tl.int64)
    at = (gc * 4)[:, None] * N + cols[None, :]
    w0 = tl.load(w_ptr + at)
    w1 = tl.load(w_ptr + at + N)
    w2 = tl.load(w_ptr + at + 2 * N)
    w3 = tl.load(w_ptr + at + 3 * N)
    sb = gc[:, None] * N + cols[None, :]
    s = tl.load(s_ptr + sb).to(tl.float32)
    b = tl.load(b_ptr + sb).to(tl.float32)
    return w0, w1, w2, w3, s, b


@triton.jit
def _acc(acc, w0, w1, w2, w3, s, b, x_row, g, row_groups, PLAIN: tl.constexpr,
         XQ8: tl.constexpr):  # fmt: skip
    """acc plus the tile's scale (x . q) + bias sum(x) (x . q in q/64 units)."""
    ok = g < row_groups
    if XQ8:
        l0, l1, l2, l3, h0, h1, h2, h3, d, xs = x_codes(x_row, g, ok, PLAIN)
        dot = group_dot(w0, w1, w2, w3, l0, l1, l2, l3, h0, h1, h2, h3, PLAIN)
        return acc + dot * (s * (d * Q_SCALE)) + b * (xs * Q_SCALE)
    if PLAIN:
        d0, t0 = _plain_word(w0, x_row, g, 0, ok)
        d1, t1 = _plain_word(w1, x_row, g, 1, ok)
        d2, t2 = _plain_word(w2, x_row, g, 2, ok)
        d3, t3 = _plain_word(w3, x_row, g, 3, ok)
        dot = d0 + d1 + d2 + d3
        xs = t0 + t1 + t2 + t3
    else:
        a0, u0 = _x_pair(x_row, g, 0, ok)
        a1, u1 = _x_pair(x_row, g, 8, ok)
        a2, u2 = _x_pair(x_row, g, 1, ok)
        a3, u3 = _x_pair(x_row, g, 9, ok)
        b0, v0 = _x_pair(x_row, g, 2, ok)
        b1, v1 = _x_pair(x_row, g, 10, ok)
        b2, v2 = _x_pair(x_row, g, 3, ok)
        b3, v3 = _x_pair(x_row, g, 11, ok)
        c0, y0 = _x_pair(x_row, g, 4, ok)
        c1, y1 = _x_pair(x_row, g, 12, ok)
        c2, y2 = _x_pair(x_row, g, 5, ok)
        c3, y3 = _x_pair(x_row, g, 13, ok)
        d0, z0 = _x_pair(x_row, g, 6, ok)
        d1, z1 = _x_pair(x_row, g, 14, ok)
        d2, z2 = _x_pair(x_row, g, 7, ok)
        d3, z3 = _x_pair(x_row, g, 15, ok)
        dot = tl.inline_asm_elementwise(
            INT4_ASM,
            "=r" + ",r" * 20,
            [w0, w1, w2, w3, a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
        xs = (u0 + u1 + u2 + u3) + (v0 + v1 + v2 + v3) + (y0 + y1 + y2 + y3) + (z0 + z1 + z2 + z3)
    return acc + dot * s + b * (xs * Q_SCALE)


@triton.jit
def _rows_acc(acc0, acc1, acc2, acc3, w0, w1, w2, w3, s, b, x_ptr, m0, M, K, g, row_groups,
              PLAIN: tl.constexpr, ROWS: tl.constexpr, XQ8: tl.constexpr):  # fmt: skip
    """_acc for rows m0 .. m0 + ROWS - 1 of x over one tile (rows past M read row M - 1: their
    sums are never stored; m0 itself is always a row)."""
    tile = w0, w1, w2, w3, s, b
    acc0 = _acc(acc0, *tile, x_ptr + m0.to(tl.int64) * K, g, row_groups, PLAIN, XQ8)
    if ROWS > 1:
        acc1 = _acc(acc1, *tile, _row(x_ptr, m0 + 1, M, K), g, row_groups, PLAIN, XQ8)
    if ROWS > 2:
        acc2 = _acc(acc2, *tile, _row(x_ptr, m0 + 2, M, K), g, row_groups, PLAIN, XQ8)
    if ROWS > 3:
        acc3 = _acc(acc3, *tile, _row(x_ptr, m0 + 3, M, K), g, row_groups, PLAIN, XQ8)
    return acc0, acc1, acc2, acc3


@triton.jit
def _row(x_ptr, m, M, K):
    """Row m of x [M, K], or its last row past M."""
    return x_ptr + tl.minimum(m, M - 1).to(tl.int64) * K


@triton.jit
def _store_row(acc, r, out_ptr, part_ptr, counter_ptr, m0, M, N, pid_n, pid_k, splits,
               BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):  # fmt: skip
    """Row m0 + r's sums, when that row exists."""
    if m0 + r < M:
        y = tl.sum(acc, axis=0) * (1.0 / Q_SCALE)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        store_or_merge(
            y, out_ptr, part_ptr, counter_ptr, m0 + r, M, N, cols, cols < N, pid_n, pid_k,
            splits, SPLIT,
        )  # fmt: skip


@triton.jit(do_not_specialize=["M", "splits"])
def _int4_cols_gemv_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, part_ptr, counter_ptr, M, N, K, groups_per_split,
    splits,
    BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, EVEN_N: tl.constexpr, PLAIN: tl.constexpr,
    PDL: tl.constexpr, SPLIT: tl.constexpr, ROWS: tl.constexpr, XQ8: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    m0 = tl.program_id(2) * ROWS  # this program's rows: m0 .. m0 + ROWS - 1
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if not EVEN_N:  # no masks on W (a predicate per load serializes them): columns past N
        cols = tl.minimum(cols, N - 1)  # repeat column N - 1 (not stored; loads not vectors)
    row_groups = K // 32
    acc0 = tl.zeros((GROUPS, BLOCK_N), dtype=tl.float32)
    acc1, acc2, acc3 = acc0, acc0, acc0  # used as ROWS asks
    g_start = pid_k * groups_per_split
    g = g_start + tl.arange(0, GROUPS)
    w0, w1, w2, w3, s, b = _tile(w_ptr, s_ptr, b_ptr, cols, N, row_groups, g)
    pdl_wait(PDL)  # the first tile before the wait, its x after (gemv_pdl.py)
    acc0, acc1, acc2, acc3 = _rows_acc(
        acc0, acc1, acc2, acc3, w0, w1, w2, w3, s, b, x_ptr, m0, M, K, g, row_groups, PLAIN,
        ROWS, XQ8,
    )  # fmt: skip
    for g0 in range(g_start + GROUPS, g_start + groups_per_split, GROUPS):
        g = g0 + tl.arange(0, GROUPS)
        w0, w1, w2, w3, s, b = _tile(w_ptr, s_ptr, b_ptr, cols, N, row_groups, g)
        acc0, acc1, acc2, acc3 = _rows_acc(
            acc0, acc1, acc2, acc3, w0, w1, w2, w3, s, b, x_ptr, m0, M, K, g, row_groups,
            PLAIN, ROWS, XQ8,
        )  # fmt: skip
    _store_row(
        acc0, 0, out_ptr, part_ptr, counter_ptr, m0, M, N, pid_n, pid_k, splits, BLOCK_N, SPLIT
    )
    if ROWS > 1:
        _store_row(
            acc1, 1, out_ptr, part_ptr, counter_ptr, m0, M, N, pid_n, pid_k, splits, BLOCK_N, SPLIT
        )
    if ROWS > 2:
        _store_row(
            acc2, 2, out_ptr, part_ptr, counter_ptr, m0, M, N, pid_n, pid_k, splits, BLOCK_N, SPLIT
        )
    if ROWS > 3:
        _store_row(
            acc3, 3, out_ptr, part_ptr, counter_ptr, m0, M, N, pid_n, pid_k, splits, BLOCK_N, SPLIT
        )


class GemvLaunch(NamedTuple):
    block_n: int  # output columns a program
    groups: int  # groups of 32 along K an iteration
    col_blocks: int
    split: int  # K splits
    per_split: int  # groups a split


WHOLE_K_COLUMNS = 32


def gemv_launch(
    m: int, n: int, k_groups: int, config: Int4ColsGemv, device: torch.device, rows: int = 1
) -> GemvLaunch:
    """The GEMV's launch for `m` row programs of `rows` rows each, over N columns and K =
    32 k_groups. gemv_grid's at config.block_n where K is not split. Where it is:
    - one row a program and K within config.whole_k_groups: 32 columns a program over the
      whole of K in one iteration, no K split (no partials, no merge). H100, Llama-3.1-8B at
      one row (ops/int4_gemv_anatomy.py's bn32-g128): o 7.01 -> 6.11 us, qkv 8.67 -> 7.51
      (H200: 6.58 -> 5.42, 7.88 -> 6.53; the chain of quant_bench only 1.753 -> 1.748 ms);
    - else half the columns where that gives more programs (or as many with fewer splits):
      o and qkv 8.67 -> 7.37 and 9.75 -> 8.83 us (bn64); down and gate_up keep 128."""
    chunks = triton.cdiv(k_groups, config.groups)
    wide = gemv_grid(m, n, chunks, config.groups, config.block_n, config.waves, device)
    if wide[2] == 1 or config.block_n < 128:
        return GemvLaunch(wide[0], config.groups, *wide[1:])
    if rows == 1 and k_groups <= config.whole_k_groups:  # never at whole_k_groups 0
        groups = triton.next_power_of_2(k_groups)
        return GemvLaunch(WHOLE_K_COLUMNS, groups, triton.cdiv(n, WHOLE_K_COLUMNS), 1, k_groups)
    half = gemv_grid(m, n, chunks, config.groups, config.block_n // 2, config.waves, device)
    programs = (wide[1] * wide[2], -wide[2]), (half[1] * half[2], -half[2])
    chosen = half if programs[1] > programs[0] else wide
    return GemvLaunch(chosen[0], config.groups, *chosen[1:])


def split_compiled(launch: GemvLaunch) -> bool:
    """Whether the launch's kernel is compiled with SPLIT on: every one but the whole-K
    launches' (which never split). At one split it stores its sums (arrival.store_or_merge),
    so gate_up's launch and down's share one compiled kernel: two a layer, not three. H100,
    Llama-3.1-8B at one row (ops/int4_chain_probe.py, quant_bench): the chain 2.034 -> 1.850
    ms (each switch to another compiled kernel costs ~1.5 us; docs/benchmarks.md, session 43)."""
    return launch.block_n != WHOLE_K_COLUMNS


def int4_cols_gemv(x: torch.Tensor, w: Int4Cols, config: Int4ColsGemv) -> torch.Tensor:
    """x [M, K] (a few rows) @ W^T through the decode GEMV above."""
    m, k = x.shape
    n = w.words.shape[1]
    rows = min(m, config.max_rows)  # rows a program
    programs_m = triton.cdiv(m, rows)
    launch = gemv_launch(programs_m, n, k // 32, config, x.device, rows)
    split = launch.split
    out, part, counters = split_buffers(split, m, n, launch.col_blocks, x)
    pdl = pdl_mode(config.pdl, x.device)
    _int4_cols_gemv_kernel[(launch.col_blocks, split, programs_m)](
        x, w.words, w.scale, w.bias, out, part, counters, m, n, k, launch.per_split, split,
        launch.block_n, launch.groups, n % launch.block_n == 0, x.device.type != "cuda", pdl,
        split_compiled(launch), rows, config.x_int8, num_warps=config.num_warps,
        launch_pdl=pdl == GDC,
    )  # fmt: skip
    return out


def int4_cols_matmul(
    x: torch.Tensor, w: Int4Cols, gemv: Int4ColsGemv | None = None
) -> torch.Tensor:
    """x [M, K] @ W^T for the column layout; returns [M, N] in x's dtype. One row takes the
    GEMV (`gemv`, else INT4_COLS_GEMV), up to `gemv.max_rows` (else INT4_ROWS_GEMV's) too, more
    the GEMM."""
    m, k = x.shape
    assert k % 32 == 0 and w.words.shape[0] * 8 == k, f"x has K {k}, the weight {w.shape[1]}"
    x = x.contiguous()
    if gemv is None:
        gemv = INT4_ROWS_GEMV if m > 1 else INT4_COLS_GEMV
    if m < INT4_GEMM_MIN_ROWS or m <= gemv.max_rows:
        return int4_cols_gemv(x, w, gemv)
    return int4_cols_gemm(x, w.words, w.scale, w.bias)


def int4_cols_reference(x: torch.Tensor, w: Int4Cols) -> torch.Tensor:
    """The torch reference: the fp32 weight expanded from the words, one fp32 matmul."""
    packed, scale, bias = w.rows()
    n = packed.shape[0]
    p = packed.reshape(n, -1, 16)
    q = torch.cat((p & 15, p >> 4), dim=-1).reshape(n, -1, 32).float()
    dense = (q * scale.float()[..., None] + bias.float()[..., None]).reshape(n, -1)
    return (x.float() @ dense.T).to(x.dtype)
