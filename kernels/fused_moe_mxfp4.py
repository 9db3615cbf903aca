"""The fused experts over MXFP4 weights (kernels/mxfp4.py), unpacked tile by tile in registers:
kernels/fused_moe.py's two grouped GEMMs (rows sorted by expert, gate and up with their
activation, then down times the routing weight), each weight tile read as packed bytes and an
exponent per 32 inputs, 4.25 bits a weight instead of 16.

A tile of BLOCK_K inputs is BLOCK_K / 2 bytes: the even inputs' codes (low nibbles) and the odd
ones' (high nibbles) make two [BLOCK_K / 2, BLOCK_N] weight tiles, each met by the activations'
even or odd columns, so no interleave is needed in registers. Rows are never swapped (SWAP_AB)
and K is never split: the launch takes kernels/fused_moe.py's tiles and atomic flag alone.
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
    """fp32 values of e2m1 codes (int32, 0..15)."""
    exponent = (codes >> 1) & 3
    mantissa = (codes & 1).to(tl.float32)
    magnitude = tl.where(
        exponent == 0,
        0.5 * mantissa,
        (1.0 + 0.5 * mantissa) * tl.exp2(exponent.to(tl.float32) - 1.0),
    )
    return tl.where((codes & 8) != 0, -magnitude, magnitude)


@triton.jit
def mxfp4_cols(q_base, s_base, offs_n, offs_j, stride_qn, stride_sn, j_mask, n_mask):
    """The tile of inputs 2j (even) and 2j + 1 (odd) for bytes offs_j [BLOCK_K / 2] of rows
    offs_n [BLOCK_N], as columns: (even, odd), each fp32 [BLOCK_K / 2, BLOCK_N]."""
    mask = j_mask[:, None] & n_mask[None, :]
    packed = tl.load(q_base + offs_n[None, :] * stride_qn + offs_j[:, None], mask=mask, other=0)
    group = offs_j // 16  # 16 bytes, 32 inputs a group
    exponent = tl.load(s_base + offs_n[None, :] * stride_sn + group[:, None], mask=mask, other=127)
    scale = tl.exp2(exponent.to(tl.float32) - 127.0)
    codes = packed.to(tl.int32)
    return e2m1(codes & 15) * scale, e2m1(codes >> 4) * scale


@triton.jit
def _dot_pair(a_ptrs, a_mask, q_base, s_base, offs_n, offs_j, stride_qn, stride_sn, j_mask,
              n_mask, acc, PRECISION: tl.constexpr):  # fmt: skip
    """acc + a @ w over one K tile: a's even and odd columns (a_ptrs at the even ones) against
    the packed tile's even and odd weights."""
    a_even = tl.load(a_ptrs, mask=a_mask, other=0.0)
    a_odd = tl.load(a_ptrs + 1, mask=a_mask, other=0.0)
    w_even, w_odd = mxfp4_cols(q_base, s_base, offs_n, offs_j, stride_qn, stride_sn, j_mask, n_mask)
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
        acc_gate = _dot_pair(a_ptrs, a_mask, q_gate, s_gate, offs_n, offs_j, stride_qn, stride_sn,
                             j_mask, n_mask, acc_gate, PRECISION)  # fmt: skip
        acc_up = _dot_pair(a_ptrs, a_mask, q_up, s_up, offs_n, offs_j, stride_qn, stride_sn,
                           j_mask, n_mask, acc_up, PRECISION)  # fmt: skip
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
        acc = _dot_pair(a_ptrs, valid[:, None] & j_mask[None, :], q_base, s_base, offs_n, offs_j,
                        stride_qn, stride_sn, j_mask, n_mask, acc, PRECISION)  # fmt: skip
    if HAS_BIAS:
        acc = add_expert_bias(acc, b_ptr, expert, hidden, offs_n, n_mask, False)
    weigh_and_store(
        acc, out_ptr, weights_ptr, rows, valid, offs_n, n_mask, hidden, top_k, False, ATOMIC
    )


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
