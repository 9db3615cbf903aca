"""The BYTES decode GEMVs of kernels/quant_gemv.py (Int4Gemv.BYTES, Fp8Gemv.BYTES): one
program per (BLOCK_N rows, K split, row of x) streams its weight bytes as uint8 / fp8 tiles,
products summed in fp32; quant_gemv.int4_matmul / fp8_matmul launch them (layouts there).

PDL (config.pdl, kernels/gemv_pdl.py): the first tile (W, and its scales / biases) is peeled
off the loop and loaded before griddepcontrol.wait; x and every store come after it. Without
PDL the loop is the whole K range and the kernel compiles to its PTX from before PDL.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl
from troupe.kernels.gemv_pdl import pdl_start, pdl_wait


@triton.jit
def _int4_w(packed_ptr, rows, row_ok, K, k0, half):
    """The packed int4 tile at k0 [BLOCK_N, BLOCK_K / 2] uint8, and which bytes are in K."""
    byte = k0 // 2 + half
    byte_ok = byte < K // 2
    p = tl.load(
        packed_ptr + rows.to(tl.int64)[:, None] * (K // 2) + byte[None, :],
        mask=row_ok[:, None] & byte_ok[None, :],
        other=0,
    )
    return p, byte, byte_ok


@triton.jit
def _int4_x_dot(p, x_ptr, m, K, byte, byte_ok, G: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):  # fmt: skip
    """The tile's x . q per row and group [BLOCK_N, groups] and sum(x) per group."""
    elem = (byte // 16) * 32 + byte % 16  # the low nibble's element; the high one: + 16
    xe = tl.load(x_ptr + m.to(tl.int64) * K + elem, mask=byte_ok, other=0.0).to(tl.float32)
    xo = tl.load(x_ptr + m.to(tl.int64) * K + elem + 16, mask=byte_ok, other=0.0)
    xo = xo.to(tl.float32)
    lo = (p & 15).to(tl.float32)
    hi = (p >> 4).to(tl.float32)
    dot = tl.reshape(lo * xe[None, :] + hi * xo[None, :], (BLOCK_N, BLOCK_K // G, G // 2))
    dot_g = tl.sum(dot, axis=2)  # [BLOCK_N, groups]
    x_g = tl.sum(tl.reshape(xe + xo, (BLOCK_K // G, G // 2)), axis=1)
    return dot_g, x_g


@triton.jit
def _int4_sb(scale_ptr, bias_ptr, rows, row_ok, K, k0, groups, G: tl.constexpr):
    """Scales and biases [BLOCK_N, groups] (fp32) of the tile at k0."""
    g = k0 // G + groups
    g_ok = g < K // G
    sb_off = rows.to(tl.int64)[:, None] * (K // G) + g[None, :]
    sb_mask = row_ok[:, None] & g_ok[None, :]
    s = tl.load(scale_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)
    return s, b


@triton.jit
def _int4_gemv_kernel(
    x_ptr, packed_ptr, scale_ptr, bias_ptr, out_ptr,
    N, K, k_per_split,
    G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    pid_n, pid_k, m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.arange(0, BLOCK_K // 2)
    groups = tl.arange(0, BLOCK_K // G)
    row_ok = rows < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_loop = k_start
    if PDL:  # the first tile, scales and biases before the wait; x after
        p, byte, byte_ok = _int4_w(packed_ptr, rows, row_ok, K, k_start, half)
        s, b = _int4_sb(scale_ptr, bias_ptr, rows, row_ok, K, k_start, groups, G)
        pdl_wait(PDL)
        dot_g, x_g = _int4_x_dot(p, x_ptr, m, K, byte, byte_ok, G, BLOCK_N, BLOCK_K)
        acc += tl.sum(dot_g * s + b * x_g[None, :], axis=1)
        k_loop = k_start + BLOCK_K
    for k0 in range(k_loop, k_start + k_per_split, BLOCK_K):
        p, byte, byte_ok = _int4_w(packed_ptr, rows, row_ok, K, k0, half)
        dot_g, x_g = _int4_x_dot(p, x_ptr, m, K, byte, byte_ok, G, BLOCK_N, BLOCK_K)
        s, b = _int4_sb(scale_ptr, bias_ptr, rows, row_ok, K, k0, groups, G)
        acc += tl.sum(dot_g * s + b * x_g[None, :], axis=1)
    out = out_ptr + (pid_k.to(tl.int64) * tl.num_programs(2) + m) * N + rows
    tl.store(out, acc, mask=row_ok)


@triton.jit
def _fp8_w(w_ptr, rows, row_ok, K, k):
    """The fp8 tile [BLOCK_N, BLOCK_K] at columns k, as fp32."""
    return tl.load(
        w_ptr + rows.to(tl.int64)[:, None] * K + k[None, :],
        mask=row_ok[:, None] & (k < K)[None, :],
        other=0.0,
    ).to(tl.float32)


@triton.jit
def _fp8_s(scale_ptr, rows, row_ok, k0, scale_bn, scale_bk, scale_cols):
    """BLOCK_K divides scale_bk: one scale per row for the whole tile at k0."""
    return tl.load(scale_ptr + (rows // scale_bn) * scale_cols + k0 // scale_bk, mask=row_ok)


@triton.jit
def _fp8_gemv_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr,
    N, K, k_per_split, scale_bn, scale_bk, scale_cols,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    pid_n, pid_k, m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    row_ok = rows < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_loop = k_start
    if PDL:  # the first tile and its scales before the wait; x after
        w = _fp8_w(w_ptr, rows, row_ok, K, k_start + cols)
        s = _fp8_s(scale_ptr, rows, row_ok, k_start, scale_bn, scale_bk, scale_cols)
        pdl_wait(PDL)
        k = k_start + cols
        x = tl.load(x_ptr + m.to(tl.int64) * K + k, mask=k < K, other=0.0).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1) * s
        k_loop = k_start + BLOCK_K
    for k0 in range(k_loop, k_start + k_per_split, BLOCK_K):
        k = k0 + cols
        w = _fp8_w(w_ptr, rows, row_ok, K, k)
        x = tl.load(x_ptr + m.to(tl.int64) * K + k, mask=k < K, other=0.0).to(tl.float32)
        s = _fp8_s(scale_ptr, rows, row_ok, k0, scale_bn, scale_bk, scale_cols)
        acc += tl.sum(w * x[None, :], axis=1) * s
    out = out_ptr + (pid_k.to(tl.int64) * tl.num_programs(2) + m) * N + rows
    tl.store(out, acc, mask=row_ok)
