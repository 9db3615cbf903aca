"""moe_align (kernels/moe_align.py) in one Triton program, for decode-sized batches.

The torch version is some 25 small kernels (scatter_add, cumsums, a radix sort, gathers,
searchsorted): tens of microseconds at decode sizes, next to a few hundred for the experts.
Here one program does it all, with the same output (rows ascending within each expert),
walking the rows in chunks of CHUNK with a one-hot [CHUNK, EXPERTS] matrix:

    counts   pass 1: column sums of the one-hot chunks
    offsets  exclusive cumsums of counts and of counts padded to block_m
    fill     sorted_rows = T*k (the sentinel), block_expert = the expert whose padded range
             holds the block's first row (-1 past the last)
    scatter  pass 2: a row's rank in its expert = rows of that expert in earlier chunks +
             the one-hot's cumsum down the chunk; it lands at pad_start[e] + rank

No sort network and no size-dependent constexpr: one compile per expert count (rounded to a power of two). The
passes are serial in the row count, so batches over MAX_ROWS take the torch version.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .moe_align import moe_align, padded_rows

MAX_ROWS = 4096


@triton.jit
def _align_kernel(
    ids_ptr, sorted_rows_ptr, block_expert_ptr,
    num_rows, num_experts, total_rows, num_blocks, block_m,
    EXPERTS: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    e_offs = tl.arange(0, EXPERTS)
    counts = tl.zeros((EXPERTS,), dtype=tl.int32)
    for r0 in range(0, num_rows, CHUNK):
        r = r0 + tl.arange(0, CHUNK)
        expert = tl.load(ids_ptr + r, mask=r < num_rows, other=-1).to(tl.int32)
        counts += tl.sum((expert[:, None] == e_offs[None, :]).to(tl.int32), axis=0)
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = tl.cumsum(padded, 0)
    pad_start = pad_end - padded
    for p0 in range(0, total_rows, CHUNK):
        p = p0 + tl.arange(0, CHUNK)
        tl.store(sorted_rows_ptr + p, tl.zeros_like(p) + num_rows, mask=p < total_rows)
    for b0 in range(0, num_blocks, CHUNK):
        b = b0 + tl.arange(0, CHUNK)
        before = (pad_end[None, :] <= (b * block_m)[:, None]).to(tl.int32)
        owner = tl.sum(before, axis=1)  # experts whose padded range ends at or before the block
        owner = tl.where(owner < num_experts, owner, -1)
        tl.store(block_expert_ptr + b, owner, mask=b < num_blocks)
    tl.debug_barrier()  # the sentinel fill lands before the scatter overwrites it
    seen = pad_start  # next free place of each expert
    for r0 in range(0, num_rows, CHUNK):
        r = r0 + tl.arange(0, CHUNK)
        expert = tl.load(ids_ptr + r, mask=r < num_rows, other=-1).to(tl.int32)
        hot = (expert[:, None] == e_offs[None, :]).to(tl.int32)
        place = seen[None, :] + tl.cumsum(hot, 0) - 1
        dest = tl.sum(hot * place, axis=1)
        tl.store(sorted_rows_ptr + dest, r, mask=r < num_rows)
        seen += tl.sum(hot, axis=0)


def moe_align_triton(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_align's (sorted_rows, block_expert) in one launch; the torch version above
    MAX_ROWS rows."""
    num_rows = topk_ids.numel()
    if num_rows > MAX_ROWS:
        return moe_align(topk_ids, num_experts, block_m)
    device = topk_ids.device
    total = padded_rows(num_rows, num_experts, block_m)
    num_blocks = total // block_m
    sorted_rows = torch.empty(total, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=device)
    experts_p2 = max(triton.next_power_of_2(num_experts), 16)
    _align_kernel[(1,)](
        topk_ids.reshape(-1).contiguous(), sorted_rows, block_expert,
        num_rows, num_experts, total, num_blocks, block_m,
        EXPERTS=experts_p2, CHUNK=max(16, 16384 // experts_p2), num_warps=8,
    )  # fmt: skip
    return sorted_rows, block_expert
