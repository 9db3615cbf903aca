"""The flat tile grid that the prefill attention kernels share (kernels/paged_attention.py,
kernels/extend_attention.py): which tile a program owns, its queries, where its output goes.

Grid: (query tile, kv head). A tile is BLOCK_Q new tokens of one sequence times the GROUP query
heads that share a kv head, packed as BLOCK_M = BLOCK_Q * BLOCK_G rows, so each key/value row
loaded from HBM serves the whole group. The tiles are numbered without any host-side table:
sequence s owns tiles from

    first_tile(s) = query_start_loc[s] // BLOCK_Q + s

on (an upper bound that always leaves room for its ceil(q_len / BLOCK_Q) tiles), and a program
finds its sequence by binary search over query_start_loc. The grid size, num_tokens // BLOCK_Q
+ num_seqs + 1, depends only on tensor shapes, so a CUDA graph captured for a token count
replays any mix of sequences padded to it (padding sequences have q_len 0: no tiles).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def find_seq(query_start_loc_ptr, num_seqs, tile, BLOCK_Q: tl.constexpr):
    """The last sequence s with query_start_loc[s] // BLOCK_Q + s <= tile."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def load_tile_q(
    q_ptr, q_start, q_len, local, kv_head, stride_qt, stride_qh, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """A tile's queries: BLOCK_Q of the sequence's new tokens from its `local`-th tile x the
    GROUP query heads of kv_head, one row each (token-major). Returns q [rows, BLOCK_D], each
    row's token among the new ones, its token row in q, its head, and the rows' io mask."""
    rows = tl.arange(0, BLOCK_Q * BLOCK_G)
    tok = local * BLOCK_Q + rows // BLOCK_G
    grp = rows % BLOCK_G
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = (tok < q_len) & (grp < GROUP)
    heads = kv_head * GROUP + grp
    tokens = q_start.to(tl.int64) + tok.to(tl.int64)
    io_mask = row_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    q_rows = tokens * stride_qt + heads * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=io_mask, other=0.0)
    return q, tok, tokens, heads, io_mask


@triton.jit
def store_tile(out_ptr, out, tokens, heads, io_mask, stride_ot, stride_oh, BLOCK_D: tl.constexpr):
    """A tile's output rows (load_tile_q's layout) to out, in out's dtype."""
    o_rows = tokens * stride_ot + heads * stride_oh
    o_ptrs = out_ptr + o_rows[:, None] + tl.arange(0, BLOCK_D)[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=io_mask)
