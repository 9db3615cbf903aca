"""Which (row block, N tile) a fused-MoE program computes: the launch order of the tiles.

GROUP_M 0: a 2-D grid (row blocks, N tiles), row blocks fastest. Consecutive programs share
an expert's weight tile (its row blocks are adjacent after moe_align), but a block's gathered
x rows are read again for every N tile, one whole pass over the batch apart: at prefill sizes
that x (T*k*H*2 bytes, 400 MB for DeepSeek-V2-Lite at 16,384 tokens) is re-read from HBM once
per N tile.

GROUP_M g >= 1: a 1-D grid walked in groups of g row blocks x every N tile, row blocks fastest
within a group (Triton's matmul tutorial's order): the g blocks' x rows and the expert's weight
tiles stay in L2 while the group runs. g = 1 runs all N tiles of one block together.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_ids(num_blocks, num_n, GROUP_M: tl.constexpr):
    """(row block, N tile) of this program, int64, from program_id 0 (and 1 when GROUP_M 0)."""
    if GROUP_M == 0:
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:
        pid = tl.program_id(0)
        width = GROUP_M * num_n
        first = (pid // width) * GROUP_M
        size = tl.minimum(num_blocks - first, GROUP_M)
        pid_m = first + (pid % width) % size
        pid_n = (pid % width) // size
    return pid_m.to(tl.int64), pid_n.to(tl.int64)


def tile_grid(num_blocks: int, num_n: int, group_m: int, split_k: int = 1) -> tuple[int, int, int]:
    """The launch grid tile_ids expects; axis 2 holds K slices (kernels/moe_split_k.py)."""
    if group_m:
        return (num_blocks * num_n, 1, split_k)
    return (num_blocks, num_n, split_k)
