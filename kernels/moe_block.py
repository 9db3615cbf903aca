"""What every fused-MoE kernel (kernels/fused_moe.py, kernels/moe_split_k.py) does alike with its
row block: the block's expert, its sorted rows and N columns, the fp32 accumulator in the
dot's orientation, the weight tile read as columns [BLOCK_K, BLOCK_N], the expert's bias
added to the accumulator, and the activation of gate and up.

    program -> (row block pid_m, N tile pid_n)       kernels/moe_tiles.py
    block_expert[pid_m] -> expert (< 0: a padding block, the kernel returns)
    rows_ptr[pid_m * BLOCK_M ..] -> rows (token * top_k + slot; >= num_rows: padding)
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .moe_tiles import tile_ids


@triton.jit
def block_expert(block_expert_ptr, num_blocks, n, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, N tile, expert int64) of this program over n output columns."""
    pid_m, pid_n = tile_ids(num_blocks, tl.cdiv(n, BLOCK_N), GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    return pid_m, pid_n, expert


@triton.jit
def block_rows(
    rows_ptr, pid_m, pid_n, num_rows, n, top_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):  # fmt: skip
    """The block's sorted positions, rows (int64), their mask and tokens, its columns and
    theirs."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + offs_m).to(tl.int64)
    valid = rows < num_rows
    token = rows // top_k
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < n
    return offs_m, rows, valid, token, offs_n, n_mask


@triton.jit
def zero_acc(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """The fp32 accumulator: [BLOCK_N, BLOCK_M] when SWAP_AB (the weight tile is the dot's M
    side: wgmma wants 64 rows, a decode block has few), else [BLOCK_M, BLOCK_N]."""
    if SWAP_AB:
        return tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        return tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def weight_cols(w_base, offs_n, offs_k, stride_wn, k_mask, n_mask):
    """The expert's weight tile as columns [BLOCK_K, BLOCK_N] (rows n of w, K along axis 0)."""
    return tl.load(
        w_base + offs_n[None, :] * stride_wn + offs_k[:, None],
        mask=k_mask[:, None] & n_mask[None, :],
        other=0.0,
    )


@triton.jit
def add_expert_bias(acc, bias_ptr, expert, width, offs_n, n_mask, SWAP_AB: tl.constexpr):
    """acc plus row `expert` of a bias [E, width] at the columns offs_n (n_mask: where it
    applies), in zero_acc's orientation."""
    bias = tl.load(bias_ptr + expert * width + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if SWAP_AB:
        return acc + bias[:, None]
    else:
        return acc + bias[None, :]


@triton.jit
def swiglu(gate, up, alpha, limit, CLAMPED: tl.constexpr):
    """The experts' activation of fp32 gate and up tiles: silu(gate) * up, or when CLAMPED
    GPT-OSS's clamped SwiGLU with alpha and limit (kernels/clamped_swiglu.py)."""
    if CLAMPED:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        return (up + 1.0) * gate * tl.sigmoid(gate * alpha)
    else:
        return gate * tl.sigmoid(gate) * up


@triton.jit
def weigh_and_store(
    acc, out_ptr, weights_ptr, rows, valid, offs_n, n_mask, hidden, top_k,
    SWAP_AB: tl.constexpr, ATOMIC: tl.constexpr,
):  # fmt: skip
    """The down projection's tile times each row's routing weight, stored at the row's (token,
    slot) place of out [T*k, H], or (ATOMIC) added into an fp32 out [T, H]."""
    weight = tl.load(weights_ptr + rows, mask=valid, other=0.0).to(tl.float32)
    if SWAP_AB:  # [N, M]: rows along axis 1
        acc = acc * weight[None, :]
        mask = n_mask[:, None] & valid[None, :]
        if ATOMIC:
            dst = out_ptr + (rows // top_k)[None, :] * hidden + offs_n[:, None]
            tl.atomic_add(dst, acc, mask=mask)
        else:
            dst = out_ptr + rows[None, :] * hidden + offs_n[:, None]
            tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = acc * weight[:, None]
        mask = valid[:, None] & n_mask[None, :]
        if ATOMIC:
            dst = out_ptr + (rows // top_k)[:, None] * hidden + offs_n[None, :]
            tl.atomic_add(dst, acc, mask=mask)
        else:
            dst = out_ptr + rows[:, None] * hidden + offs_n[None, :]
            tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask)


def down_output(x: torch.Tensor, top_k: int, atomic: bool) -> torch.Tensor:
    """weigh_and_store's destination: a zeroed fp32 [T, H] (atomic) or [T*k, H] in x's dtype."""
    num_tokens, hidden = x.shape
    if atomic:
        return torch.zeros(num_tokens, hidden, dtype=torch.float32, device=x.device)
    return torch.empty(num_tokens * top_k, hidden, dtype=x.dtype, device=x.device)


def token_sums(out: torch.Tensor, x: torch.Tensor, top_k: int, atomic: bool) -> torch.Tensor:
    """[T, H] in x's dtype from down_output's tensor: each token's k rows summed in fp32."""
    if atomic:
        return out.to(x.dtype)
    return out.view(x.shape[0], top_k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)
