"""The token rows of one punica tile, read inside a Triton program (kernels/lora_shrink.py,
kernels/lora_expand.py) from the plan that kernels/lora_tiles.py lays out: the tile's
positions [start, end) in `order`, and the token ids there. Offsets are int64."""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_token_rows(table_ptr, order_ptr, capacity, tile, num_tokens, BLOCK_M: tl.constexpr):
    """(token ids [BLOCK_M] int64, valid [BLOCK_M]) of tile `tile`: up to BLOCK_M tokens of
    one slot; rows past the tile's end, or past `num_tokens`, are not valid."""
    start = tl.load(table_ptr + capacity + tile).to(tl.int64)
    end = tl.load(table_ptr + 2 * capacity + tile).to(tl.int64)
    pos = start + tl.arange(0, BLOCK_M).to(tl.int64)
    valid = pos < end
    token = tl.load(order_ptr + pos, mask=valid, other=0).to(tl.int64)
    valid = valid & (token < num_tokens)  # a stale plan (a graph's warm-up) stays in bounds
    return token, valid
