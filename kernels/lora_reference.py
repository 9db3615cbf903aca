"""The punica LoRA ops in plain torch: each token through its own slot's factors only. The CPU
runs these (data-dependent indexing: a host sync per slot, free there); the kernel tests compare
kernels/lora_shrink.py and kernels/lora_expand.py against them.

Layouts (gpu/lora_linear.py), L slots of rank R (max_lora_rank), S fused slices:

    a_all  [L x S x R, K]   slot l's rows of slice s at (l S + s) R; zero rows pad a lower rank
    b_all  [N, L x R]       the slices' output rows stacked (slice s: rows start_s .. +n_s);
                            slot l's columns at l R; scaled by alpha / r as stored
    u      [T, S, R] fp32   the shrink: u[t, s] = A_(l, s) x_t for token t of slot l, else 0
"""

from __future__ import annotations

import torch


def lora_shrink_reference(
    x: torch.Tensor, a_all: torch.Tensor, token_slots: torch.Tensor, num_slices: int, rank: int
) -> torch.Tensor:
    """u [T, S, R] fp32 (fp32 products and sums); zeros for tokens without a slot (-1)."""
    num_tokens = x.shape[0]
    slots = token_slots[:num_tokens]
    out = torch.zeros(num_tokens, num_slices, rank, dtype=torch.float32, device=x.device)
    per_slot = a_all.view(-1, num_slices * rank, a_all.shape[1])
    for slot in torch.unique(slots[slots >= 0]).tolist():
        rows = torch.nonzero(slots == slot).squeeze(1)
        shrunk = x[rows].float() @ per_slot[slot].float().t()
        out[rows] = shrunk.view(-1, num_slices, rank)
    return out


def lora_expand_reference(
    y: torch.Tensor,
    u: torch.Tensor,
    b_all: torch.Tensor,
    token_slots: torch.Tensor,
    slices: tuple[int, ...],
) -> None:
    """In place: y[t, slice s] += u[t, s] B_(l, s)^T for token t of slot l (fp32 sum, one
    rounding to y's dtype); rows of tokens without a slot untouched."""
    num_tokens, _, rank = u.shape
    slots = token_slots[:num_tokens]
    for slot in torch.unique(slots[slots >= 0]).tolist():
        rows = torch.nonzero(slots == slot).squeeze(1)
        start = 0
        for index, size in enumerate(slices):
            b = b_all[start : start + size, slot * rank : (slot + 1) * rank].float()
            added = y[rows, start : start + size].float() + u[rows, index] @ b.t()
            y[rows, start : start + size] = added.to(y.dtype)
            start += size
