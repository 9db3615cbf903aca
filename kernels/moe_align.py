"""Sort the (token, slot) rows of a routed batch by expert, padded per expert to BLOCK_M.

topk_ids [T, k] names k experts per token; row r = t * k + slot is one (token, expert) pair.
The fused MoE kernels (kernels/fused_moe.py) run one program per BLOCK_M rows of one expert:

    sorted_rows [P] int32    rows grouped by expert (ascending), each group padded with the
                             sentinel T * k to a multiple of BLOCK_M
    block_expert [P / BLOCK_M] int32   the expert of each block, -1 past the last group

P = T*k + E*(BLOCK_M - 1) rounded up to BLOCK_M: it depends on shapes only, and the whole
computation is device-side torch (no host sync), so a CUDA graph can capture it.
"""

from __future__ import annotations

import torch


def padded_rows(num_rows: int, num_experts: int, block_m: int) -> int:
    """P: room for every row plus each expert's padding, a multiple of block_m."""
    most = num_rows + num_experts * (block_m - 1)
    return -(-most // block_m) * block_m


def moe_align(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_rows [P] int32, block_expert [P / block_m] int32) for topk_ids [T, k]."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    num_rows = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    start = torch.cumsum(counts, 0) - counts
    order = torch.sort(flat, stable=True).indices
    expert = flat[order]
    dest = pad_start[expert] + torch.arange(num_rows, device=device) - start[expert]
    total = padded_rows(num_rows, num_experts, block_m)
    sorted_rows = torch.full((total,), num_rows, dtype=torch.int32, device=device)
    sorted_rows[dest] = order.to(torch.int32)
    block_start = torch.arange(0, total, block_m, device=device)
    block_expert = torch.searchsorted(pad_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return sorted_rows, block_expert.to(torch.int32)
