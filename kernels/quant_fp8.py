"""fp8 (e4m3) weights in the GPU's column layout, and the Triton matmuls that read it (issue 16).

    Fp8Cols   words [K/4, N] int32: column n's word r holds the codes of W[n, 4r..4r+3] (byte
              j: k = 4r + j); scale fp32 [ceil(N/Bn), ceil(K/Bk)] as the checkpoint ships it:
              w[n, k] = scale[n // Bn, k // Bk] q (per channel: Bk = K, Bn = 1)

As for int4 (kernels/quant_int4.py): a thread holds adjacent output columns of one block of 16
codes, the lanes of a warp share the block, x is one broadcast load per warp.

    decode (GEMV, one row of x)  16 codes (4 words) per column multiplied out in one PTX block
        (kernels/half2_ptx.FP8_ASM, x's pairs scaled by 2^-10), summed in fp32 per block,
        times its scale (so Bk must be a multiple of 16). K splits: fp32 partials, the last
        split to arrive sums them (kernels/arrival.py). PLAIN (TRITON_INTERPRET=1): the same
        products in fp32.
    more rows (GEMM)  tiles of words expanded to codes, fp32, x's dtype, tl.dot, times the
        tile's scales; K split while the grid is thin (skinny batches).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from troupe.kernels.arrival import gemv_grid, split_buffers, store_or_merge
from troupe.kernels.gemv_pdl import GDC, pdl_mode, pdl_start, pdl_wait
from troupe.kernels.half2_ptx import FP8_ASM
from troupe.kernels.quant_cols import cols_gemm

X_SCALE = tl.constexpr(2.0**-10)


@dataclass(frozen=True)
class Fp8Cols:
    """An fp8 weight [N, K] in the column layout above."""

    words: torch.Tensor  # [K/4, N] int32
    scale: torch.Tensor  # fp32 [ceil(N/Bn), ceil(K/Bk)]

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.words.shape[1]), int(self.words.shape[0]) * 4

    @property
    def block(self) -> tuple[int, int]:
        """(Bn, Bk): the rows and columns of W one scale covers."""
        n, k = self.shape
        return triton.cdiv(n, self.scale.shape[0]), triton.cdiv(k, self.scale.shape[1])

    @staticmethod
    def fits(weight: torch.Tensor, scale: torch.Tensor) -> bool:
        """Whether this layout takes the weight: K a multiple of 16, scale blocks along K too."""
        k = weight.shape[1]
        return k % 16 == 0 and (scale.shape[1] == 1 or triton.cdiv(k, scale.shape[1]) % 16 == 0)

    @staticmethod
    def from_rows(weight: torch.Tensor, scale: torch.Tensor) -> Fp8Cols:
        """From the checkpoint's layout: e4m3 [N, K] and its scales."""
        words = weight.contiguous().view(torch.uint8).view(torch.int32).t().contiguous()
        return Fp8Cols(words, scale.float().contiguous())

    def rows(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """The e4m3 codes [N, K] back (of rows `index` only, when given)."""
        words = self.words if index is None else self.words[:, index]
        return words.t().contiguous().view(torch.float8_e4m3fn)


@dataclass(frozen=True)
class Fp8ColsGemv:
    """The decode GEMV's launch: output columns per program (a multiple of 128), blocks of 16
    codes per iteration, warps, programs per SM wanted (K is split to reach it), PDL."""

    block_n: int = 128  # the best of 8 configs on the H200 (docs/benchmarks.md, session 14)
    blocks: int = 16
    num_warps: int = 8
    waves: int = 2
    pdl: bool = True


FP8_COLS_GEMV = Fp8ColsGemv()


@triton.jit
def _x_pair(x_row, q, J: tl.constexpr, ok):
    """x[16 q + 2J], x[16 q + 2J + 1] per block q, times 2^-10, as f16x2 (one int32)."""
    if x_row.dtype.element_ty == tl.bfloat16:
        u = tl.load(x_row.to(tl.pointer_type(tl.int32)) + q * 8 + J, mask=ok, other=0)
        lo = (u << 16).to(tl.float32, bitcast=True)
        hi = (u & -65536).to(tl.float32, bitcast=True)
    else:
        lo = tl.load(x_row + q * 16 + 2 * J, mask=ok, other=0.0).to(tl.float32)
        hi = tl.load(x_row + q * 16 + 2 * J + 1, mask=ok, other=0.0).to(tl.float32)
    p = tl.inline_asm_elementwise(
        "cvt.rn.f16x2.f32 $0, $2, $1;",
        "=r,r,r",
        [lo * X_SCALE, hi * X_SCALE],
        dtype=tl.int32,
        is_pure=True,
        pack=1,
    )
    return p[:, None]


@triton.jit
def _plain_word(w, x_row, q, WORD: tl.constexpr, ok):
    """Word WORD of each block times its 4 x values in fp32 (the interpreter's path)."""
    dot = tl.zeros(w.shape, dtype=tl.float32)
    for j in tl.static_range(4):
        code = ((w >> (8 * j)) & 255).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        xv = tl.load(x_row + q * 16 + 4 * WORD + j, mask=ok, other=0.0).to(tl.float32)
        dot += code.to(tl.float32) * (xv * X_SCALE)[:, None]
    return dot


@triton.jit
def _tile(w_ptr, scale_ptr, cols, N, K, q, scale_bn, scale_bk, scale_cols):
    """Words [Q, BN] x 4 and scales [Q, BN] of blocks q (past K: the last block)."""
    qc = tl.minimum(q, K // 16 - 1).to(tl.int64)
    at = (qc * 4)[:, None] * N + cols[None, :]
    w0 = tl.load(w_ptr + at)
    w1 = tl.load(w_ptr + at + N)
    w2 = tl.load(w_ptr + at + 2 * N)
    w3 = tl.load(w_ptr + at + 3 * N)
    s_at = (cols // scale_bn)[None, :] * scale_cols + (qc * 16 // scale_bk)[:, None]
    s = tl.load(scale_ptr + s_at)
    return w0, w1, w2, w3, s


@triton.jit
def _acc(acc, w0, w1, w2, w3, s, x_row, q, K, PLAIN: tl.constexpr):
    ok = q < K // 16
    if PLAIN:
        dot = _plain_word(w0, x_row, q, 0, ok) + _plain_word(w1, x_row, q, 1, ok)
        dot += _plain_word(w2, x_row, q, 2, ok) + _plain_word(w3, x_row, q, 3, ok)
    else:
        p0 = _x_pair(x_row, q, 0, ok)
        p1 = _x_pair(x_row, q, 1, ok)
        p2 = _x_pair(x_row, q, 2, ok)
        p3 = _x_pair(x_row, q, 3, ok)
        p4 = _x_pair(x_row, q, 4, ok)
        p5 = _x_pair(x_row, q, 5, ok)
        p6 = _x_pair(x_row, q, 6, ok)
        p7 = _x_pair(x_row, q, 7, ok)
        dot = tl.inline_asm_elementwise(
            FP8_ASM,
            "=r" + ",r" * 12,
            [w0, w1, w2, w3, p0, p1, p2, p3, p4, p5, p6, p7],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    return acc + dot * s


@triton.jit(do_not_specialize=["M", "splits"])
def _fp8_cols_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, part_ptr, counter_ptr, M, N, K, blocks_per_split, splits,
    scale_bn, scale_bk, scale_cols,
    BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr, EVEN_N: tl.constexpr, PLAIN: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    pid_n, pid_k, m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = out_cols
    if not EVEN_N:  # no masks on W: columns past N repeat column N - 1 (not stored)
        cols = tl.minimum(cols, N - 1)
    x_row = x_ptr + m.to(tl.int64) * K
    acc = tl.zeros((BLOCKS, BLOCK_N), dtype=tl.float32)
    q_start = pid_k * blocks_per_split
    q = q_start + tl.arange(0, BLOCKS)
    w0, w1, w2, w3, s = _tile(w_ptr, scale_ptr, cols, N, K, q, scale_bn, scale_bk, scale_cols)
    pdl_wait(PDL)  # the first tile before the wait, its x after (gemv_pdl.py)
    acc = _acc(acc, w0, w1, w2, w3, s, x_row, q, K, PLAIN)
    for q0 in range(q_start + BLOCKS, q_start + blocks_per_split, BLOCKS):
        q = q0 + tl.arange(0, BLOCKS)
        w0, w1, w2, w3, s = _tile(w_ptr, scale_ptr, cols, N, K, q, scale_bn, scale_bk, scale_cols)
        acc = _acc(acc, w0, w1, w2, w3, s, x_row, q, K, PLAIN)
    y = tl.sum(acc, axis=0) * (1.0 / X_SCALE)
    # the split form at every launch (it stores at one split): a step's launches share a kernel
    store_or_merge(
        y, out_ptr, part_ptr, counter_ptr, m, M, N, out_cols, out_cols < N, pid_n, pid_k, splits,
        True,
    )  # fmt: skip


@triton.jit
def _fp8_cols_gemm_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, k_per_split, scale_bn, scale_bk, scale_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = rn < N
    word = tl.arange(0, BLOCK_K // 4)
    shift = tl.arange(0, 4) * 8
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        r = k0 // 4 + word
        w = tl.load(
            w_ptr + r.to(tl.int64)[:, None] * N + rn[None, :],
            mask=(r < K // 4)[:, None] & col_ok[None, :],
            other=0,
        )
        # codes [BLOCK_K, BLOCK_N]: k = 4r + j is bits 8j..8j+7 of word r
        codes = tl.reshape((w[:, None, :] >> shift[None, :, None]) & 255, (BLOCK_K, BLOCK_N))
        wv = codes.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        k = k0 + cols
        x = tl.load(
            x_ptr + rm.to(tl.int64)[:, None] * K + k[None, :],
            mask=(rm < M)[:, None] & (k < K)[None, :],
            other=0.0,
        )
        s = tl.load(scale_ptr + (rn // scale_bn) * scale_cols + k0 // scale_bk, mask=col_ok)
        acc += tl.dot(x, wv.to(x.dtype), input_precision=PRECISION) * s[None, :]
    out = out_ptr + (pid_k.to(tl.int64) * M + rm.to(tl.int64))[:, None] * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm < M)[:, None] & col_ok[None, :])


def fp8_cols_gemv(x: torch.Tensor, w: Fp8Cols, config: Fp8ColsGemv) -> torch.Tensor:
    """x [M, K] (a row or few) @ W^T through the decode GEMV above."""
    m, k = x.shape
    n = w.words.shape[1]
    bn, bk = w.block
    chunks = triton.cdiv(k // 16, config.blocks)
    block_n, col_blocks, split, per_split = gemv_grid(
        m, n, chunks, config.blocks, config.block_n, config.waves, x.device
    )
    out, part, counters = split_buffers(split, m, n, col_blocks, x)
    pdl = pdl_mode(config.pdl, x.device)
    _fp8_cols_gemv_kernel[(col_blocks, split, m)](
        x, w.words, w.scale, out, part, counters, m, n, k, per_split, split, bn, bk,
        w.scale.shape[1], block_n, config.blocks, n % block_n == 0, x.device.type != "cuda",
        pdl, num_warps=config.num_warps, launch_pdl=pdl == GDC,
    )  # fmt: skip
    return out


def fp8_cols_matmul(x: torch.Tensor, w: Fp8Cols, gemv: Fp8ColsGemv | None = None) -> torch.Tensor:
    """x [M, K] @ W^T for the column layout; returns [M, N] in x's dtype."""
    m, k = x.shape
    n = w.words.shape[1]
    assert w.shape[1] == k, f"x has K {k}, the weight {w.shape[1]}"
    x = x.contiguous()
    if m == 1:
        return fp8_cols_gemv(x, w, FP8_COLS_GEMV if gemv is None else gemv)
    bn, bk = w.block
    block_k = min(128 if x.device.type == "cuda" else 64, bk & -bk)  # a power of 2 dividing Bk
    g = cols_gemm(x, n, block_k)
    _fp8_cols_gemm_kernel[g.grid](
        x, w.words, w.scale, g.part, m, n, k, g.per_split, bn, bk, w.scale.shape[1], g.block_m,
        g.block_n, block_k, g.precision, num_warps=4,
    )  # fmt: skip
    return g.part[0] if g.grid[2] == 1 else g.part.sum(0).to(x.dtype)


def fp8_cols_reference(x: torch.Tensor, w: Fp8Cols) -> torch.Tensor:
    """The torch reference: the fp32 weight expanded from the codes and scales, one matmul."""
    codes = w.rows().float()
    bn, bk = w.block
    n, k = codes.shape
    s = w.scale.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (x.float() @ (codes * s).T).to(x.dtype)
