"""Triton matmuls over weights kept quantized: y[M, N] = x[M, K] @ W^T, W expanded in registers.

Two weight forms, two shapes each:

    int4   packed uint8 [N, K/2] in Q4_0 nibble order (per group of 32: byte j holds element
           j low and j + 16 high), scale and bias [N, K/32] (fp16 on the GPU): w = scale * q
           + bias per group (gpu/gguf_quant.Int4Blocks: GGUF Q4_0, Q4_1, Q4_K)
    fp8    e4m3 [N, K] with scales [ceil(N/Bn), ceil(K/Bk)] fp32: w = scale[n // Bn, k // Bk]
           * q (per channel: Bn = 1, Bk = K; DeepSeek/Qwen block fp8: 128 x 128)

    decode   M = 1 (fp8 with narrow scale blocks: M <= GEMV_MAX_ROWS; int4: M < INT4_SKINNY_
             MIN_ROWS): one program per (BLOCK_N rows, K split, row of x); each
             streams its weight bytes once with 16-byte loads, products summed in fp32;
             split-K partials land in an fp32 [SPLIT, M, N] buffer that one sum reduces
             (no atomics: the result does not depend on timing)
    skinny   2 <= M <= SKINNY_MAX_ROWS: like decode, but all rows of x in one program
             (padded to 16 for tl.dot), so W is read once, not once per row (H200, Llama-8B
             fp8 step at 4 and 16 rows: 3.5 ms instead of 7.1-7.4; int4 at 4 rows took
             10.6-12.2 ms as a GEMV, 2.6-3x bf16's)
    prefill  more rows: tiles of W expanded to x's dtype in registers, then tl.dot

The decode GEMV above is the BYTES variant (its kernels: kernels/quant_bytes.py); INT4_GEMV /
FP8_GEMV below pick it or HALF2 (kernels/quant_half2.py, quant_half2_fp8.py: packed f16x2 PTX;
configs in quant_gemv_config.py), and whether it launches with PDL (kernels/gemv_pdl.py).

Int4 sums per group first (sum_k x q, and sum_k x), then scales once per group:
    y[n] = sum_g scale[n, g] * (x_g . q_g) + bias[n, g] * sum(x_g)
The torch references at the end are what the kernel tests compare against.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl
from troupe.kernels.gemv_pdl import GDC, pdl_mode
from troupe.kernels.quant_bytes import _fp8_gemv_kernel, _int4_gemv_kernel
from troupe.kernels.quant_gemv_config import Fp8Gemv, Fp8GemvConfig, Int4Gemv, Int4GemvConfig
from troupe.kernels.quant_half2 import int4_half2
from troupe.kernels.quant_half2_fp8 import fp8_half2, fp8_half2_fits

GEMV_MAX_ROWS = 8
SKINNY_MAX_ROWS = 16
INT4_SKINNY_MIN_ROWS = 2  # from here to SKINNY_MAX_ROWS rows int4 takes the skinny kernel
# The decode GEMVs the engine's quantized linears use (gpu/quant_linear.py): switch a variant by
# editing one of these lines (`python -m troupe.ops.quant_bench --sweep-variants` ranks them).
INT4_GEMV = Int4GemvConfig(Int4Gemv.HALF2, block_n=4, groups=128, num_warps=4, k_splits=0, pdl=True)
FP8_GEMV = Fp8GemvConfig(Fp8Gemv.HALF2, block_n=4, block_w=512, num_warps=4, k_splits=0, pdl=True)


@triton.jit
def _int4_gemm_kernel(
    x_ptr, packed_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.arange(0, BLOCK_K // 2)
    groups = tl.arange(0, BLOCK_K // G)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        byte = k0 // 2 + half
        byte_ok = byte < K // 2
        p = tl.load(
            packed_ptr + rn.to(tl.int64)[:, None] * (K // 2) + byte[None, :],
            mask=(rn < N)[:, None] & byte_ok[None, :],
            other=0,
        )
        g = k0 // G + groups
        sb_off = rn.to(tl.int64)[:, None] * (K // G) + g[None, :]
        sb_mask = (rn < N)[:, None] & (g < K // G)[None, :]
        s = tl.load(scale_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)[:, :, None]
        b = tl.load(bias_ptr + sb_off, mask=sb_mask, other=0.0).to(tl.float32)[:, :, None]
        # shapes spelled inline: a tuple held in a variable stops being constexpr (triton 3.6)
        w_lo = tl.reshape(
            tl.reshape((p & 15).to(tl.float32), (BLOCK_N, BLOCK_K // G, G // 2)) * s + b,
            (BLOCK_N, BLOCK_K // 2),
        )
        w_hi = tl.reshape(
            tl.reshape((p >> 4).to(tl.float32), (BLOCK_N, BLOCK_K // G, G // 2)) * s + b,
            (BLOCK_N, BLOCK_K // 2),
        )
        elem = (byte // 16) * 32 + byte % 16
        x_off = rm.to(tl.int64)[:, None] * K + elem[None, :]
        x_mask = (rm < M)[:, None] & byte_ok[None, :]
        xe = tl.load(x_ptr + x_off, mask=x_mask, other=0.0)
        xo = tl.load(x_ptr + x_off + 16, mask=x_mask, other=0.0)
        acc += tl.dot(xe, tl.trans(w_lo.to(xe.dtype)), input_precision=PRECISION)
        acc += tl.dot(xo, tl.trans(w_hi.to(xo.dtype)), input_precision=PRECISION)
    out = out_ptr + (pid_k.to(tl.int64) * M + rm.to(tl.int64))[:, None] * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def _fp8_gemm_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr,
    M, N, K, scale_bn, scale_bk, scale_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + cols
        x = tl.load(
            x_ptr + rm.to(tl.int64)[:, None] * K + k[None, :],
            mask=(rm < M)[:, None] & (k < K)[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + rn.to(tl.int64)[:, None] * K + k[None, :],
            mask=(rn < N)[:, None] & (k < K)[None, :],
            other=0.0,
        )
        s = tl.load(scale_ptr + (rn // scale_bn) * scale_cols + k0 // scale_bk, mask=rn < N)
        w = tl.trans(w.to(tl.float32).to(x.dtype))
        acc += tl.dot(x, w, input_precision=PRECISION) * s[None, :]
    out = out_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def _fp8_skinny_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr,
    M, N, K, k_per_split, scale_bn, scale_bk, scale_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    row_ok = rows < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        k = k0 + cols
        k_ok = k < K
        w = tl.load(
            w_ptr + rows.to(tl.int64)[:, None] * K + k[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        x = tl.load(
            x_ptr + rm.to(tl.int64)[:, None] * K + k[None, :],
            mask=(rm < M)[:, None] & k_ok[None, :],
            other=0.0,
        )
        s = tl.load(scale_ptr + (rows // scale_bn) * scale_cols + k0 // scale_bk, mask=row_ok)
        w = tl.trans(w.to(tl.float32).to(x.dtype))
        acc += tl.dot(x, w, input_precision=PRECISION) * s[None, :]
    out = out_ptr + (pid_k.to(tl.int64) * M + rm.to(tl.int64))[:, None] * N + rows[None, :]
    tl.store(out, acc, mask=(rm < M)[:, None] & row_ok[None, :])


def _gemv_shape(
    n: int, m: int, k: int, block_k: int, device: torch.device, widths: tuple[int, ...]
) -> tuple[int, int]:
    """(block_n, K splits) for a GEMV: the widest tile that still gives the device about four
    programs per SM without splitting K (one kernel, written straight into the output), else
    the narrowest, with K split to make up the rest (partials summed after)."""
    if device.type != "cuda":
        return widths[0], 1
    sms = int(torch.cuda.get_device_properties(device).multi_processor_count)
    for block_n in widths:
        if triton.cdiv(n, block_n) * m >= 4 * sms:
            return block_n, 1
    block_n = widths[-1]
    return block_n, _splits(triton.cdiv(n, block_n) * m, k, block_k, device)


def _splits(n_tiles: int, k: int, block_k: int, device: torch.device) -> int:
    """K splits so the grid covers the device about four times over (a CPU: 1)."""
    if device.type != "cuda":
        return 1
    sms = int(torch.cuda.get_device_properties(device).multi_processor_count)
    chunks = triton.cdiv(k, block_k)
    split = max(1, min(chunks, 4 * sms // max(1, n_tiles)))
    while chunks % split:  # whole chunks per split
        split -= 1
    return int(split)


def _partials(split: int, m: int, n: int, x: torch.Tensor) -> torch.Tensor:
    """Where a GEMV writes: K-split partials in fp32, or (one split) the output itself."""
    dtype = torch.float32 if split > 1 else x.dtype
    return torch.empty(split, m, n, dtype=dtype, device=x.device)


def _precision(x: torch.Tensor) -> str:
    """tl.dot's input precision: fp32 activations stay fp32 (the default would round to tf32)."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    group: int,
    gemv: Int4GemvConfig | None = None,
) -> torch.Tensor:
    """x [M, K] @ W^T for the int4 form above; returns [M, N] in x's dtype. `gemv`: the decode
    GEMV (None: INT4_GEMV)."""
    assert group == 32, f"the int4 layout has groups of 32, got {group}"
    gemv = INT4_GEMV if gemv is None else gemv
    m, k = x.shape
    n = packed.shape[0]
    x = x.contiguous()
    if m == 1 and gemv.variant is Int4Gemv.HALF2:
        return int4_half2(x, packed, scale, bias, gemv)
    if INT4_SKINNY_MIN_ROWS <= m <= SKINNY_MAX_ROWS:
        return int4_skinny(x, packed, scale, bias, group)
    if m <= GEMV_MAX_ROWS:
        block_k = 256
        block_n, split = _gemv_shape(n, m, k, block_k, x.device, (32,))  # narrower: slower (H200)
        part = _partials(split, m, n, x)
        per_split = triton.cdiv(triton.cdiv(k, block_k), split) * block_k
        grid = (triton.cdiv(n, block_n), split, m)
        pdl = pdl_mode(gemv.pdl, x.device)
        _int4_gemv_kernel[grid](
            x, packed, scale, bias, part, n, k, per_split, group, block_n, block_k, pdl,
            launch_pdl=pdl == GDC,
        )  # fmt: skip
        return part[0] if split == 1 else part.sum(0).to(x.dtype)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m, block_n = (64, 64) if x.device.type == "cuda" else (16, 32)
    block_k = 64
    tiles = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), 1)
    _int4_gemm_kernel[tiles](
        x, packed, scale, bias, out, m, n, k, triton.cdiv(k, block_k) * block_k, group,
        block_m, block_n, block_k, _precision(x),
    )  # fmt: skip
    return out


def int4_skinny(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor,
    group: int,
    block_n: int = 64,  # the best of an H200 sweep (block_n 16-128, block_k 128-512, 4/8 warps)
    block_k: int = 128,
    num_warps: int = 4,
) -> torch.Tensor:
    """A few rows of x (2 to SKINNY_MAX_ROWS) in one program, padded to 16 for tl.dot: each W
    tile is read once for all rows, not once per row as the decode GEMV reads it; K split so
    the grid fills the device, fp32 partials summed after."""
    m, k = x.shape
    n = packed.shape[0]
    split = _splits(triton.cdiv(n, block_n), k, block_k, x.device)
    part = _partials(split, m, n, x)
    per_split = triton.cdiv(triton.cdiv(k, block_k), split) * block_k
    _int4_gemm_kernel[(1, triton.cdiv(n, block_n), split)](
        x, packed, scale, bias, part, m, n, k, per_split, group, 16, block_n, block_k,
        _precision(x), num_warps=num_warps,
    )  # fmt: skip
    return part[0] if split == 1 else part.sum(0).to(x.dtype)


def fp8_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    gemv: Fp8GemvConfig | None = None,
) -> torch.Tensor:
    """x [M, K] @ W^T for fp8 W [N, K] with block scales [ceil(N/Bn), ceil(K/Bk)] fp32. `gemv`:
    the decode GEMV (None: FP8_GEMV)."""
    gemv = FP8_GEMV if gemv is None else gemv
    m, k = x.shape
    n = weight.shape[0]
    scale_bn = triton.cdiv(n, scale.shape[0])
    scale_bk = triton.cdiv(k, scale.shape[1])
    x, scale = x.contiguous(), scale.contiguous().float()
    half2 = gemv.variant is Fp8Gemv.HALF2 and fp8_half2_fits(weight, scale_bk, scale.shape[1])
    if m == 1 and half2:  # at 4 and 8 rows HALF2 took 3x and 6x the skinny kernel's time (H200)
        return fp8_half2(x, weight, scale, gemv)
    gemv_rows = m == 1 or (m <= GEMV_MAX_ROWS and scale_bk & -scale_bk < 16)
    if gemv_rows:
        block_k = min(512, scale_bk & -scale_bk)  # a power of two that divides scale_bk
        block_n, split = _gemv_shape(n, m, k, block_k, x.device, (16, 8))
        part = _partials(split, m, n, x)
        per_split = triton.cdiv(triton.cdiv(k, block_k), split) * block_k
        grid = (triton.cdiv(n, block_n), split, m)
        pdl = pdl_mode(gemv.pdl, x.device)
        _fp8_gemv_kernel[grid](
            x, weight, scale, part, n, k, per_split, scale_bn, scale_bk, scale.shape[1],
            block_n, block_k, pdl, launch_pdl=pdl == GDC,
        )  # fmt: skip
        return part[0] if split == 1 else part.sum(0).to(x.dtype)
    if m <= SKINNY_MAX_ROWS and scale_bk & -scale_bk >= 16:
        block_n = 32  # the best of an H200 sweep (block_n 16-64, block_k 128-512, 4/8 warps)
        block_k = min(256, scale_bk & -scale_bk)
        split = _splits(triton.cdiv(n, block_n), k, block_k, x.device)
        part = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
        per_split = triton.cdiv(triton.cdiv(k, block_k), split) * block_k
        _fp8_skinny_kernel[(triton.cdiv(n, block_n), split)](
            x, weight, scale, part, m, n, k, per_split, scale_bn, scale_bk, scale.shape[1],
            16, block_n, block_k, _precision(x),
        )  # fmt: skip
        return (part[0] if split == 1 else part.sum(0)).to(x.dtype)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_k = min(128, scale_bk & -scale_bk)
    block_m, block_n = (64, 64) if x.device.type == "cuda" else (16, 32)
    tiles = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _fp8_gemm_kernel[tiles](
        x, weight, scale, out, m, n, k, scale_bn, scale_bk, scale.shape[1],
        block_m, block_n, block_k, _precision(x),
    )  # fmt: skip
    return out


def int4_reference(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, group: int
) -> torch.Tensor:
    """The torch reference of int4_matmul (fp32 weight expanded, fp32 matmul)."""
    n = packed.shape[0]
    p = packed.reshape(n, -1, 16)
    q = torch.cat((p & 15, p >> 4), dim=-1).reshape(n, -1, group).float()
    w = (q * scale.float()[..., None] + bias.float()[..., None]).reshape(n, -1)
    return (x.float() @ w.T).to(x.dtype)


def fp8_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The torch reference of fp8_matmul."""
    n, k = weight.shape
    bn, bk = triton.cdiv(n, scale.shape[0]), triton.cdiv(k, scale.shape[1])
    s = scale.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (x.float() @ (weight.float() * s).T).to(x.dtype)
