"""The SPLIT_K fused-MoE variant: both projections split along K, partial sums added in fp32.

    1. _gate_up_split_kernel, (row block, 2I / BLOCK_N) tiles x SPLIT_K slices: x rows @ w13[e]^T
       over one K slice of H, the whole [gate | up] row of w13 as one GEMM (no SiLU yet), plus
       the expert's b13 row in the first slice only (HAS_BIAS), atomically added into
       h [P, 2I] fp32 (stored directly when SPLIT_K is 1).
    2. _down_split_kernel, (row block, H / BLOCK_N) tiles x SPLIT_K slices: loads gate and up slices
       of h, act = silu(gate) * up or GPT-OSS's clamped SwiGLU (CLAMPED) rounded to the
       weights' dtype (the fused kernel's act), act @ w2[e]^T over one K slice of I, plus the
       expert's b2 row in the first slice only (HAS_BIAS), times the routing weight,
       atomically added into out [T, H] fp32 at the row's token.

At decode sizes an expert has one or two row blocks: split_k multiplies the programs that
stream its weights (every SM busy with a few K slices each) at the cost of the fp32 h buffer
(P x 2I x 4 bytes, small next to the weights) and atomics. With split_k 1 it is the
unfused pair: gate/up as one plain GEMM, SiLU moved into the down kernel's load. Tile order:
kernels/moe_tiles.py; sorting: kernels/moe_align.py.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .clamped_swiglu import ClampedSwiglu
from .moe_block import add_expert_bias, block_expert, block_rows, swiglu, weight_cols, zero_acc
from .moe_config import MoeKernelConfig, precision_for
from .moe_tiles import tile_grid


@triton.jit
def _gate_up_split_kernel(
    x_ptr, w_ptr, b_ptr, h_ptr, rows_ptr, block_expert_ptr,
    num_rows, num_blocks, hidden, inter2, top_k, k_slice, stride_x, stride_we, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr,
    PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, expert = block_expert(block_expert_ptr, num_blocks, inter2, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(2)
    if expert < 0:
        return
    offs_m, _, valid, token, offs_n, n_mask = block_rows(
        rows_ptr, pid_m, pid_n, num_rows, inter2, top_k, BLOCK_M, BLOCK_N
    )
    w_base = w_ptr + expert * stride_we
    k_start = pid_k * k_slice
    k_end = tl.minimum(k_start + k_slice, hidden)
    acc = zero_acc(BLOCK_M, BLOCK_N, SWAP_AB)  # SWAP_AB: (w^T)^T @ a^T
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_end
        a = tl.load(
            x_ptr + token[:, None] * stride_x + offs_k[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = weight_cols(w_base, offs_n, offs_k, stride_wn, k_mask, n_mask)
        if SWAP_AB:
            acc += tl.dot(tl.trans(w), tl.trans(a), input_precision=PRECISION)
        else:
            acc += tl.dot(a, w, input_precision=PRECISION)
    if SWAP_AB:
        acc = tl.trans(acc)
    if HAS_BIAS:
        acc = add_expert_bias(acc, b_ptr, expert, inter2, offs_n, n_mask & (pid_k == 0), False)
    dst = h_ptr + offs_m[:, None] * inter2 + offs_n[None, :]
    mask = valid[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(dst, acc, mask=mask)
    else:
        tl.atomic_add(dst, acc, mask=mask)


@triton.jit
def _down_split_kernel(
    h_ptr, w_ptr, b_ptr, out_ptr, weights_ptr, rows_ptr, block_expert_ptr,
    num_rows, num_blocks, hidden, inter, top_k, k_slice, stride_we, stride_wn, alpha, limit,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr, PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, expert = block_expert(block_expert_ptr, num_blocks, hidden, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(2)
    if expert < 0:
        return
    offs_m, rows, valid, _, offs_n, n_mask = block_rows(
        rows_ptr, pid_m, pid_n, num_rows, hidden, top_k, BLOCK_M, BLOCK_N
    )
    w_base = w_ptr + expert * stride_we
    h_rows = h_ptr + offs_m[:, None] * (2 * inter)
    k_start = pid_k * k_slice
    k_end = tl.minimum(k_start + k_slice, inter)
    acc = zero_acc(BLOCK_M, BLOCK_N, SWAP_AB)  # SWAP_AB: (w^T)^T @ act^T
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_end
        a_mask = valid[:, None] & k_mask[None, :]
        gate = tl.load(h_rows + offs_k[None, :], mask=a_mask, other=0.0)
        up = tl.load(h_rows + inter + offs_k[None, :], mask=a_mask, other=0.0)
        act = swiglu(gate, up, alpha, limit, CLAMPED).to(w_ptr.dtype.element_ty)
        w = weight_cols(w_base, offs_n, offs_k, stride_wn, k_mask, n_mask)
        if SWAP_AB:
            acc += tl.dot(tl.trans(w), tl.trans(act), input_precision=PRECISION)
        else:
            acc += tl.dot(act, w, input_precision=PRECISION)
    if SWAP_AB:
        acc = tl.trans(acc)
    if HAS_BIAS:
        acc = add_expert_bias(acc, b_ptr, expert, hidden, offs_n, n_mask & (pid_k == 0), False)
    weight = tl.load(weights_ptr + rows, mask=valid, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    token = rows // top_k  # again here: block_rows' token moved up changes the SASS
    dst = out_ptr + token[:, None] * hidden + offs_n[None, :]
    tl.atomic_add(dst, acc, mask=valid[:, None] & n_mask[None, :])


def _k_slice(k: int, split_k: int, block_k: int) -> int:
    """Elements of K per slice, a multiple of block_k (the last slice may be short)."""
    per_slice = -(-k // split_k)
    return -(-per_slice // block_k) * block_k


def fused_moe_split_k(
    x: torch.Tensor,
    w13: torch.Tensor,
    b13: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    clamped: ClampedSwiglu | None,
    weights: torch.Tensor,
    sorted_rows: torch.Tensor,
    block_expert: torch.Tensor,
    top_k: int,
    block_m: int,
    cfg: MoeKernelConfig,
) -> torch.Tensor:
    """The experts' weighted sum [T, H] for contiguous x, w13, w2 (and biases b13, b2 when
    given), the activation `clamped` (None: silu(gate) * up), flat weights [T*k] and the
    expert-sorted rows of moe_align(block_m)."""
    num_tokens, hidden = x.shape
    inter = w2.shape[2]
    num_rows = num_tokens * top_k
    num_blocks = block_expert.numel()
    bn, bk, split, group_m = cfg.block_n, cfg.block_k, cfg.split_k, cfg.group_m
    launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    precision = precision_for(x.dtype)
    alpha, limit = (clamped.alpha, clamped.limit) if clamped is not None else (0.0, 0.0)
    alloc = torch.empty if split == 1 else torch.zeros
    h = alloc(sorted_rows.numel(), 2 * inter, dtype=torch.float32, device=x.device)
    _gate_up_split_kernel[tile_grid(num_blocks, triton.cdiv(2 * inter, bn), group_m, split)](
        x, w13, b13, h, sorted_rows, block_expert,
        num_rows, num_blocks, hidden, 2 * inter, top_k, _k_slice(hidden, split, bk),
        x.stride(0), w13.stride(0), w13.stride(1),
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, SPLIT_K=split, SWAP_AB=cfg.swap_ab,
        PRECISION=precision, HAS_BIAS=b13 is not None, **launch,
    )  # fmt: skip
    out = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=x.device)
    _down_split_kernel[tile_grid(num_blocks, triton.cdiv(hidden, bn), group_m, split)](
        h, w2, b2, out, weights, sorted_rows, block_expert,
        num_rows, num_blocks, hidden, inter, top_k, _k_slice(inter, split, bk), w2.stride(0), w2.stride(1),
        alpha, limit,
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, SWAP_AB=cfg.swap_ab,
        PRECISION=precision, HAS_BIAS=b2 is not None, CLAMPED=clamped is not None, **launch,
    )  # fmt: skip
    return out.to(x.dtype)
