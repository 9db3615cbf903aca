"""The fused experts over MXFP4 weights (kernels/mxfp4.py), unpacked tile by tile in registers:
kernels/fused_moe.py's two grouped GEMMs (rows sorted by expert, gate and up with their
activation, then down times the routing weight), each weight tile read as packed bytes and an
exponent per 32 inputs, 4.25 bits a weight instead of 16.

A tile of BLOCK_K inputs is BLOCK_K / 2 bytes: the even inputs' codes (low nibbles) and the odd
ones' (high nibbles) make two [BLOCK_K / 2, BLOCK_N] weight tiles, each met by the activations'
even or odd columns, so no interleave is needed in registers. A value is made from bits (e2m1,
e8m0: no exp2), and a group's exponent is loaded once for its 16 bytes. Rows are never swapped
(SWAP_AB) and K is never split: the launch takes kernels/fused_moe.py's tiles and atomic flag
alone.

The packed GEMMs unpack every weight tile once per block of rows, so their cost grows with the
rows an expert gets. From UNPACK_ROWS rows an expert on average, kernels/fused_moe.py unpacks
the experts once (`unpack_experts`, a memory-bound pass that writes them in bf16, transient)
and runs the bf16 GEMMs instead: on an H100 at GPT-OSS 20B's shapes, 256 tokens took 2.5 ms
packed (32 rows an expert) against 0.65 ms for the bf16 GEMMs alone.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .clamped_swiglu import ClampedSwiglu
from .moe_block import (
    add_expert_bias,
    block_expert,
    block_rows,
    down_output,
    swiglu,
    token_sums,
    weigh_and_store,
)
from .moe_config import MoeKernelConfig
from .moe_tiles import tile_grid
from .mxfp4 import Mxfp4Experts


@triton.jit
def e2m1(codes):
    """fp32 values of e2m1 codes (int32, 0..15), built as bits: the sign; for exponent field
    e > 0, fp32 exponent e + 126 and the mantissa bit as its top bit; 0.5 (e = 0, m = 1); 0."""
    field = (codes >> 1) & 3
    mantissa = codes & 1
    biased = tl.where(field == 0, 126 * mantissa, field + 126)
    top = tl.where(field == 0, 0, mantissa)
    bits = ((codes & 8) << 28) | (biased << 23) | (top << 22)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e8m0(exponent):
    """fp32 2^(exponent - 127) of e8m0 exponents (int32, 0..254) as bits (0: the subnormal)."""
    return tl.where(exponent == 0, 0x00400000, exponent << 23).to(tl.float32, bitcast=True)


@triton.jit
def mxfp4_cols(q_base, s_base, offs_n, k0, num_bytes, stride_qn, stride_sn, n_mask,
               BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The tile of inputs k0 + 2j (even) and k0 + 2j + 1 (odd), j < BLOCK_K / 2, of rows offs_n
    [BLOCK_N], as columns: (even, odd), each fp32 [BLOCK_K / 2, BLOCK_N]. Each group's exponent
    is loaded once and spread over its 16 bytes."""
    offs_j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    mask = (offs_j < num_bytes)[:, None] & n_mask[None, :]
    packed = tl.load(q_base + offs_n[None, :] * stride_qn + offs_j[:, None], mask=mask, other=0)
    GROUPS: tl.constexpr = BLOCK_K // 32
    groups = k0 // 32 + tl.arange(0, GROUPS)  # 16 bytes, 32 inputs a group
    g_mask = (groups < num_bytes // 16)[:, None] & n_mask[None, :]
    s_ptrs = s_base + offs_n[None, :] * stride_sn + groups[:, None]
    scale = e8m0(tl.load(s_ptrs, mask=g_mask, other=127).to(tl.int32))
    spread = tl.broadcast_to(scale[:, None, :], (GROUPS, 16, BLOCK_N))
    scale = tl.reshape(spread, (BLOCK_K // 2, BLOCK_N))
    codes = packed.to(tl.int32)
    return e2m1(codes & 15) * scale, e2m1(codes >> 4) * scale


@triton.jit
def _dot_pair(a_ptrs, a_mask, q_base, s_base, offs_n, k0, num_bytes, stride_qn, stride_sn,
              n_mask, acc, PRECISION: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_N: tl.constexpr):  # fmt: skip
    """acc + a @ w over one K tile: a's even and odd columns (a_ptrs at the even ones) against
    the packed tile's even and odd weights."""
    a_even = tl.load(a_ptrs, mask=a_mask, other=0.0)
    a_odd = tl.load(a_ptrs + 1, mask=a_mask, other=0.0)
    w_even, w_odd = mxfp4_cols(q_base, s_base, offs_n, k0, num_bytes, stride_qn, stride_sn, n_mask,
                               BLOCK_K, BLOCK_N)  # fmt: skip
    acc = tl.dot(a_even, w_even.to(a_even.dtype), acc, input_precision=PRECISION)
    return tl.dot(a_odd, w_odd.to(a_odd.dtype), acc, input_precision=PRECISION)


@triton.jit
def _gate_up_kernel(
    x_ptr, q_ptr, s_ptr, b_ptr, act_ptr, rows_ptr, block_expert_ptr,
    num_rows, num_blocks, hidden, inter, top_k, stride_x, stride_qe, stride_qn, stride_se,
    stride_sn, alpha, limit,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr,
    CLAMPED: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, expert = block_expert(block_expert_ptr, num_blocks, inter, BLOCK_N, GROUP_M)
    if expert < 0:
        return
    offs_m, _, valid, token, offs_n, n_mask = block_rows(
        rows_ptr, pid_m, pid_n, num_rows, inter, top_k, BLOCK_M, BLOCK_N
    )
    q_gate, s_gate = q_ptr + expert * stride_qe, s_ptr + expert * stride_se
    q_up, s_up = q_gate + inter * stride_qn, s_gate + inter * stride_sn
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros_like(acc_gate)
    for k0 in range(0, hidden, BLOCK_K):
        offs_j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        j_mask = offs_j < hidden // 2
        a_ptrs = x_ptr + token[:, None] * stride_x + 2 * offs_j[None, :]
        a_mask = valid[:, None] & j_mask[None, :]
        acc_gate = _dot_pair(a_ptrs, a_mask, q_gate, s_gate, offs_n, k0, hidden // 2, stride_qn,
                             stride_sn, n_mask, acc_gate, PRECISION, BLOCK_K, BLOCK_N)  # fmt: skip
        acc_up = _dot_pair(a_ptrs, a_mask, q_up, s_up, offs_n, k0, hidden // 2, stride_qn,
                           stride_sn, n_mask, acc_up, PRECISION, BLOCK_K, BLOCK_N)  # fmt: skip
    if HAS_BIAS:  # b [E, 2I]: gate | up
        acc_gate = add_expert_bias(acc_gate, b_ptr, expert, 2 * inter, offs_n, n_mask, False)
        acc_up = add_expert_bias(acc_up, b_ptr + inter, expert, 2 * inter, offs_n, n_mask, False)
    act = swiglu(acc_gate, acc_up, alpha, limit, CLAMPED).to(act_ptr.dtype.element_ty)
    tl.store(act_ptr + offs_m[:, None] * inter + offs_n[None, :], act, mask=n_mask[None, :])


@triton.jit
def _down_kernel(
    act_ptr, q_ptr, s_ptr, b_ptr, out_ptr, weights_ptr, rows_ptr, block_expert_ptr,
    num_rows, num_blocks, hidden, inter, top_k, stride_qe, stride_qn, stride_se, stride_sn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, ATOMIC: tl.constexpr, PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, expert = block_expert(block_expert_ptr, num_blocks, hidden, BLOCK_N, GROUP_M)
    if expert < 0:
        return
    offs_m, rows, valid, _, offs_n, n_mask = block_rows(
        rows_ptr, pid_m, pid_n, num_rows, hidden, top_k, BLOCK_M, BLOCK_N
    )
    q_base, s_base = q_ptr + expert * stride_qe, s_ptr + expert * stride_se
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        offs_j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        j_mask = offs_j < inter // 2
        a_ptrs = act_ptr + offs_m[:, None] * inter + 2 * offs_j[None, :]
        acc = _dot_pair(a_ptrs, valid[:, None] & j_mask[None, :], q_base, s_base, offs_n, k0,
                        inter // 2, stride_qn, stride_sn, n_mask, acc, PRECISION, BLOCK_K,
                        BLOCK_N)  # fmt: skip
    if HAS_BIAS:
        acc = add_expert_bias(acc, b_ptr, expert, hidden, offs_n, n_mask, False)
    weigh_and_store(
        acc, out_ptr, weights_ptr, rows, valid, offs_n, n_mask, hidden, top_k, False, ATOMIC
    )


UNPACK_ROWS = 16  # rows an expert gets on average from which the experts are unpacked once
_UNPACK_BLOCK = 1024  # bytes a program unpacks


@triton.jit
def _unpack_kernel(q_ptr, s_ptr, out_ptr, num_bytes, BLOCK: tl.constexpr):
    """out [2 * num_bytes] of q [num_bytes] (rows of K / 2 bytes, flat) and s [num_bytes / 16]:
    byte i holds inputs 2i (low nibble) and 2i + 1, its exponent is s[i // 16]."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_bytes
    codes = tl.load(q_ptr + offs, mask=mask, other=0).to(tl.int32)
    scale = e8m0(tl.load(s_ptr + offs // 16, mask=mask, other=127).to(tl.int32))
    even, odd = e2m1(codes & 15) * scale, e2m1(codes >> 4) * scale
    values = tl.reshape(tl.join(even, odd), (2 * BLOCK,)).to(out_ptr.dtype.element_ty)
    outs = 2 * tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, 2 * BLOCK)
    tl.store(out_ptr + outs, values, mask=outs < 2 * num_bytes)


def unpack_experts(w: Mxfp4Experts, dtype: torch.dtype) -> torch.Tensor:
    """The dense [E, N, K] of `w` in `dtype` (kernels/mxfp4.unpack's values), on its device."""
    blocks, scales = w.blocks.contiguous(), w.scales.contiguous()
    out = torch.empty(w.shape, dtype=dtype, device=blocks.device)
    num_bytes = blocks.numel()
    grid = (triton.cdiv(num_bytes, _UNPACK_BLOCK),)
    _unpack_kernel[grid](blocks, scales, out, num_bytes, BLOCK=_UNPACK_BLOCK)
    return out


def launch_mxfp4(
    x: torch.Tensor,
    w13: Mxfp4Experts,
    w2: Mxfp4Experts,
    weights: torch.Tensor,
    sorted_rows: torch.Tensor,
    block_expert: torch.Tensor,
    top_k: int,
    block_m: int,
    cfg: MoeKernelConfig,
    precision: str,
    b13: torch.Tensor | None,
    b2: torch.Tensor | None,
    clamped: ClampedSwiglu | None,
) -> torch.Tensor:
    """The two GEMMs after the expert sort (kernels/fused_moe.fused_moe_triton's, whose config
    gives the tiles and the atomic flag); returns [T, H] in x's dtype."""
    num_tokens, hidden = x.shape
    inter = w2.shape[2]
    num_rows, num_blocks = num_tokens * top_k, block_expert.numel()
    bn, bk = cfg.block_n, max(cfg.block_k, 32)  # a tile covers whole exponent groups
    launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}

    def grid(n: int) -> tuple[int, int, int]:
        return tile_grid(num_blocks, triton.cdiv(n, bn), cfg.group_m)

    act = torch.empty(sorted_rows.numel(), inter, dtype=x.dtype, device=x.device)
    alpha, limit = (clamped.alpha, clamped.limit) if clamped is not None else (0.0, 0.0)
    q, s = w13.blocks, w13.scales
    _gate_up_kernel[grid(inter)](
        x, q, s, b13, act, sorted_rows, block_expert, num_rows, num_blocks, hidden, inter, top_k,
        x.stride(0), q.stride(0), q.stride(1), s.stride(0), s.stride(1), alpha, limit,
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, PRECISION=precision,
        HAS_BIAS=b13 is not None, CLAMPED=clamped is not None, **launch,
    )  # fmt: skip
    atomic = cfg.atomic_reduce
    out = down_output(x, top_k, atomic)
    q, s = w2.blocks, w2.scales
    _down_kernel[grid(hidden)](
        act, q, s, b2, out, weights, sorted_rows, block_expert, num_rows, num_blocks, hidden,
        inter, top_k, q.stride(0), q.stride(1), s.stride(0), s.stride(1),
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, ATOMIC=atomic,
        PRECISION=precision, HAS_BIAS=b2 is not None, **launch,
    )  # fmt: skip
    return token_sums(out, x, top_k, atomic)
