"""One BLOCK_N tile of a sequence's latent rows from the paged cache, for the decode kernels.

    c  [BLOCK_N, BLOCK_L]  the latent part of positions n0 .. n0 + BLOCK_N - 1
    kr [BLOCK_N, BLOCK_R]  their rope keys
Positions at or past `end` read nothing (zeros). MlaLaunch.prefetch loads the next tile into
registers before the current one is used (a hand-made double buffer for num_stages 1, where
Triton's pipeliner does not stage the gathered loads).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_latent_tile(
    cache_ptr,
    table_row_ptr,  # this sequence's block table row
    n0,
    end,
    offs_l,
    offs_r,
    l_mask,
    r_mask,
    BLOCK_SIZE: tl.constexpr,
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pos = n0 + tl.arange(0, BLOCK_N)
    p_mask = pos < end
    block = tl.load(table_row_ptr + pos // BLOCK_SIZE, mask=p_mask, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + (pos % BLOCK_SIZE)
    base = cache_ptr + slot[:, None] * (LATENT + ROPE)
    c = tl.load(base + offs_l[None, :], mask=p_mask[:, None] & l_mask[None, :], other=0.0)
    kr = tl.load(base + LATENT + offs_r[None, :], mask=p_mask[:, None] & r_mask[None, :], other=0.0)
    return c, kr
