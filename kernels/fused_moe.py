"""Fused mixture of SwiGLU experts in Triton: rows sorted by expert, two grouped GEMMs.

    1. kernels/moe_align.py groups the T*k (token, expert) rows by expert in BLOCK_M blocks.
    2. _gate_up_kernel, one program per (row block, I / BLOCK_N tile): a block gathers its
       tokens' x rows and multiplies them by its expert's gate and up rows at once (two fp32
       accumulators over the same x tile), adds the expert's gate and up biases (HAS_BIAS);
       silu(gate) * up, or GPT-OSS's clamped SwiGLU (CLAMPED), is stored: act [P, I].
    3. _down_kernel, one program per (row block, H / BLOCK_N tile): act @ w2[e]^T plus the
       expert's down bias (HAS_BIAS), times the row's routing weight, stored at the row's
       (token, slot) place [T*k, H], or (ATOMIC) added into an fp32 [T, H] output.
    4. Without ATOMIC the k slots of each token are summed (fp32 accumulation) into [T, H].

Which program gets which tile: kernels/moe_tiles.py; the variants: kernels/moe_config.py,
kernels/moe_split_k.py (SPLIT_K). Each program reads one expert's weight tile once for BLOCK_M
rows: at decode sizes every active expert's weights stream once per step (memory-bound), at
prefill sizes the blocks are full GEMM tiles (compute-bound). Grids depend on shapes only:
CUDA-graph capturable. Shapes and the exact sum: kernels/moe_reference.py.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .clamped_swiglu import ClampedSwiglu
from .fused_moe_mxfp4 import UNPACK_ROWS, launch_mxfp4, unpack_experts
from .moe_align import moe_align
from .moe_align_triton import moe_align_triton
from .moe_block import (
    add_expert_bias,
    block_expert,
    block_rows,
    down_output,
    swiglu,
    token_sums,
    weigh_and_store,
    weight_cols,
    zero_acc,
)
from .moe_config import MoeKernelConfig, MoeVariant, block_m_for, config_for, precision_for
from .moe_split_k import fused_moe_split_k
from .moe_tiles import tile_grid
from .mxfp4 import Mxfp4Experts


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, b_ptr, act_ptr, rows_ptr, block_expert_ptr,
    num_rows, num_blocks, hidden, inter, top_k, stride_x, stride_we, stride_wn, alpha, limit,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr, PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, expert = block_expert(block_expert_ptr, num_blocks, inter, BLOCK_N, GROUP_M)
    if expert < 0:
        return
    offs_m, _, valid, token, offs_n, n_mask = block_rows(
        rows_ptr, pid_m, pid_n, num_rows, inter, top_k, BLOCK_M, BLOCK_N
    )
    w_base = w_ptr + expert * stride_we
    acc_gate = zero_acc(BLOCK_M, BLOCK_N, SWAP_AB)  # SWAP_AB: acc^T = w @ x^T
    acc_up = tl.zeros_like(acc_gate)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < hidden
        if SWAP_AB:
            a_t = tl.load(
                x_ptr + token[None, :] * stride_x + offs_k[:, None],
                mask=valid[None, :] & k_mask[:, None],
                other=0.0,
            )
            w_mask = n_mask[:, None] & k_mask[None, :]
            w_rows = w_base + offs_n[:, None] * stride_wn + offs_k[None, :]
            w_gate = tl.load(w_rows, mask=w_mask, other=0.0)
            w_up = tl.load(w_rows + inter * stride_wn, mask=w_mask, other=0.0)
            acc_gate += tl.dot(w_gate, a_t, input_precision=PRECISION)
            acc_up += tl.dot(w_up, a_t, input_precision=PRECISION)
        else:
            a = tl.load(
                x_ptr + token[:, None] * stride_x + offs_k[None, :],
                mask=valid[:, None] & k_mask[None, :],
                other=0.0,
            )
            w_mask = k_mask[:, None] & n_mask[None, :]
            w_cols = w_base + offs_n[None, :] * stride_wn + offs_k[:, None]
            w_gate = tl.load(w_cols, mask=w_mask, other=0.0)
            w_up = tl.load(w_cols + inter * stride_wn, mask=w_mask, other=0.0)
            acc_gate += tl.dot(a, w_gate, input_precision=PRECISION)
            acc_up += tl.dot(a, w_up, input_precision=PRECISION)
    if HAS_BIAS:  # b [E, 2I]: gate | up
        acc_gate = add_expert_bias(acc_gate, b_ptr, expert, 2 * inter, offs_n, n_mask, SWAP_AB)
        acc_up = add_expert_bias(acc_up, b_ptr + inter, expert, 2 * inter, offs_n, n_mask, SWAP_AB)
    act = swiglu(acc_gate, acc_up, alpha, limit, CLAMPED).to(act_ptr.dtype.element_ty)
    if SWAP_AB:
        tl.store(act_ptr + offs_m[None, :] * inter + offs_n[:, None], act, mask=n_mask[:, None])
    else:
        tl.store(act_ptr + offs_m[:, None] * inter + offs_n[None, :], act, mask=n_mask[None, :])


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, b_ptr, out_ptr, weights_ptr, rows_ptr, block_expert_ptr,
    num_rows, num_blocks, hidden, inter, top_k, stride_we, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr, ATOMIC: tl.constexpr,
    PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, expert = block_expert(block_expert_ptr, num_blocks, hidden, BLOCK_N, GROUP_M)
    if expert < 0:
        return
    offs_m, rows, valid, _, offs_n, n_mask = block_rows(
        rows_ptr, pid_m, pid_n, num_rows, hidden, top_k, BLOCK_M, BLOCK_N
    )
    w_base = w_ptr + expert * stride_we
    acc = zero_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for k0 in range(0, inter, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < inter
        if SWAP_AB:
            a_t = tl.load(
                act_ptr + offs_m[None, :] * inter + offs_k[:, None],
                mask=valid[None, :] & k_mask[:, None],
                other=0.0,
            )
            w = tl.load(
                w_base + offs_n[:, None] * stride_wn + offs_k[None, :],
                mask=n_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            acc += tl.dot(w, a_t, input_precision=PRECISION)
        else:
            a = tl.load(
                act_ptr + offs_m[:, None] * inter + offs_k[None, :],
                mask=valid[:, None] & k_mask[None, :],
                other=0.0,
            )
            w = weight_cols(w_base, offs_n, offs_k, stride_wn, k_mask, n_mask)
            acc += tl.dot(a, w, input_precision=PRECISION)
    if HAS_BIAS:
        acc = add_expert_bias(acc, b_ptr, expert, hidden, offs_n, n_mask, SWAP_AB)
    weigh_and_store(
        acc, out_ptr, weights_ptr, rows, valid, offs_n, n_mask, hidden, top_k, SWAP_AB, ATOMIC
    )


def fused_moe_triton(
    x: torch.Tensor,
    w13: torch.Tensor | Mxfp4Experts,
    w2: torch.Tensor | Mxfp4Experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    config: MoeKernelConfig | None = None,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    clamped: ClampedSwiglu | None = None,
) -> torch.Tensor:
    """sum_k topk_weights * expert(x) [T, H] (kernels.ops.KernelOps.fused_moe, biases and
    activation included); config None: moe_config.config_for the batch's rows (the engine's
    defaults). MXFP4 experts take kernels/fused_moe_mxfp4.py's GEMMs (the config's tiles), or
    from UNPACK_ROWS rows an expert are unpacked once for the bf16 ones."""
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w2.shape[2]
    top_k = topk_ids.shape[1]
    num_rows = num_tokens * top_k
    if num_tokens == 0:
        return torch.zeros_like(x)
    cfg = config or config_for(num_rows, num_experts, x.element_size())
    x = x.contiguous()
    b13 = None if b13 is None else b13.contiguous()
    b2 = None if b2 is None else b2.contiguous()
    bm = cfg.block_m or block_m_for(num_rows, num_experts)
    align = moe_align_triton if cfg.triton_align else moe_align
    sorted_rows, block_expert = align(topk_ids, num_experts, bm)
    weights = topk_weights.reshape(-1).contiguous()
    precision = precision_for(x.dtype)
    if isinstance(w13, Mxfp4Experts) or isinstance(w2, Mxfp4Experts):
        assert isinstance(w13, Mxfp4Experts) and isinstance(w2, Mxfp4Experts), "both MXFP4"
        if num_rows < UNPACK_ROWS * num_experts:
            return launch_mxfp4(
                x, w13, w2, weights, sorted_rows, block_expert, top_k, bm, cfg, precision, b13,
                b2, clamped,
            )  # fmt: skip
        w13, w2 = unpack_experts(w13, x.dtype), unpack_experts(w2, x.dtype)  # once, then bf16
    w13, w2 = w13.contiguous(), w2.contiguous()
    if cfg.variant is MoeVariant.SPLIT_K:
        return fused_moe_split_k(
            x, w13, b13, w2, b2, clamped, weights, sorted_rows, block_expert, top_k, bm, cfg
        )
    num_blocks = block_expert.numel()
    group_m, bn, bk = cfg.group_m, cfg.block_n, cfg.block_k
    launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}

    def grid(n: int) -> tuple[int, int, int]:
        return tile_grid(num_blocks, triton.cdiv(n, bn), group_m)

    act = torch.empty(sorted_rows.numel(), inter, dtype=x.dtype, device=x.device)
    alpha, limit = (clamped.alpha, clamped.limit) if clamped is not None else (0.0, 0.0)
    _gate_up_kernel[grid(inter)](
        x, w13, b13, act, sorted_rows, block_expert,
        num_rows, num_blocks, hidden, inter, top_k, x.stride(0), w13.stride(0), w13.stride(1),
        alpha, limit,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, SWAP_AB=cfg.swap_ab,
        PRECISION=precision, HAS_BIAS=b13 is not None, CLAMPED=clamped is not None, **launch,
    )  # fmt: skip
    out = down_output(x, top_k, cfg.atomic_reduce)
    _down_kernel[grid(hidden)](
        act, w2, b2, out, weights, sorted_rows, block_expert,
        num_rows, num_blocks, hidden, inter, top_k, w2.stride(0), w2.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, SWAP_AB=cfg.swap_ab,
        ATOMIC=cfg.atomic_reduce,
        PRECISION=precision, HAS_BIAS=b2 is not None, **launch,
    )  # fmt: skip
    return token_sums(out, x, top_k, cfg.atomic_reduce)
