"""Fused mixture of SwiGLU experts in Triton: rows sorted by expert, two grouped GEMMs.

    1. kernels/moe_align.py groups the T*k (token, expert) rows by expert in BLOCK_M blocks.
    2. _gate_up_kernel, grid (blocks, I / BLOCK_N): a block gathers its tokens' x rows and
       multiplies them by its expert's gate and up rows at once (two fp32 accumulators over
       the same x tile); silu(gate) * up is stored: act [P, I].
    3. _down_kernel, grid (blocks, H / BLOCK_N): act @ w2[e]^T, times the row's routing
       weight, stored at the row's (token, slot) place: [T*k, H].
    4. The k slots of each token are summed (fp32 accumulation) into [T, H].

Each program reads one expert's weight tile once for BLOCK_M rows: at decode sizes every
active expert's weights stream once per step (memory-bound), at prefill sizes the blocks are
full GEMM tiles (compute-bound). Grids depend on shapes only: CUDA-graph capturable.
Shapes and the exact sum: kernels/moe_reference.py.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .moe_align import moe_align


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, act_ptr, rows_ptr, block_expert_ptr,
    num_rows, stride_x, stride_we, stride_wn,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1).to(tl.int64)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + offs_m).to(tl.int64)
    valid = rows < num_rows
    token = rows // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < INTER
    w_base = w_ptr + expert * stride_we
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < HIDDEN
        a = tl.load(
            x_ptr + token[:, None] * stride_x + offs_k[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        )
        w_mask = k_mask[:, None] & n_mask[None, :]
        w_gate = tl.load(
            w_base + offs_n[None, :] * stride_wn + offs_k[:, None], mask=w_mask, other=0.0
        )
        w_up = tl.load(
            w_base + (offs_n[None, :] + INTER) * stride_wn + offs_k[:, None],
            mask=w_mask,
            other=0.0,
        )
        acc_gate += tl.dot(a, w_gate, input_precision=PRECISION)
        acc_up += tl.dot(a, w_up, input_precision=PRECISION)
    act = acc_gate * tl.sigmoid(acc_gate) * acc_up
    dst = act_ptr + offs_m[:, None] * INTER + offs_n[None, :]
    tl.store(dst, act.to(act_ptr.dtype.element_ty), mask=n_mask[None, :])


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, out_ptr, weights_ptr, rows_ptr, block_expert_ptr,
    num_rows, stride_we, stride_wn,
    HIDDEN: tl.constexpr, INTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1).to(tl.int64)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + offs_m).to(tl.int64)
    valid = rows < num_rows
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < HIDDEN
    w_base = w_ptr + expert * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < INTER
        a = tl.load(
            act_ptr + offs_m[:, None] * INTER + offs_k[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = tl.load(
            w_base + offs_n[None, :] * stride_wn + offs_k[:, None],
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        acc += tl.dot(a, w, input_precision=PRECISION)
    weight = tl.load(weights_ptr + rows, mask=valid, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    dst = out_ptr + rows[:, None] * HIDDEN + offs_n[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


def block_m_for(num_rows: int, num_experts: int) -> int:
    """Rows per program: one block should hold most experts' rows at decode sizes (each block
    rereads its expert's weights; the counts vary around the mean), GEMM tiles at prefill."""
    per_expert = num_rows / num_experts
    return 16 if per_expert <= 8 else 32 if per_expert <= 18 else 64


def fused_moe_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    block_m: int | None = None,
    block_n: int = 64,
    block_k: int = 64,
) -> torch.Tensor:
    """sum_k topk_weights * expert(x) [T, H] (kernels.ops.KernelOps.fused_moe)."""
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w2.shape[2]
    top_k = topk_ids.shape[1]
    num_rows = num_tokens * top_k
    if num_tokens == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    w13, w2 = w13.contiguous(), w2.contiguous()
    bm = block_m or block_m_for(num_rows, num_experts)
    sorted_rows, block_expert = moe_align(topk_ids, num_experts, bm)
    num_blocks = block_expert.numel()
    act = torch.empty(sorted_rows.numel(), inter, dtype=x.dtype, device=x.device)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, w13, act, sorted_rows, block_expert,
        num_rows, x.stride(0), w13.stride(0), w13.stride(1),
        HIDDEN=hidden, INTER=inter, TOP_K=top_k,
        BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision,
    )  # fmt: skip
    per_slot = torch.empty(num_rows, hidden, dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).contiguous()
    _down_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
        act, w2, per_slot, weights, sorted_rows, block_expert,
        num_rows, w2.stride(0), w2.stride(1),
        HIDDEN=hidden, INTER=inter,
        BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision,
    )  # fmt: skip
    return per_slot.view(num_tokens, top_k, hidden).sum(dim=1, dtype=torch.float32).to(x.dtype)
