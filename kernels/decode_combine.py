"""Pass 2 of the split decode kernel (kernels/decode_attention.py): merging the splits'
partial outputs o_j and log-sum-exps lse_j (base 2) of one query head,

    out = sum_j 2^(lse_j - M) o_j / sum_j 2^(lse_j - M),  M = max_j lse_j,

BLOCK_S splits at a time with a running M. decode_reduce_kernel runs it as its own launch (one
program per sequence and query head); the FUSED variant calls combine_head from the split that
finishes last.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def combine_head(
    part_out_ptr, part_lse_ptr, out_ptr, row0, num_splits, CG: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Merges the partials at rows row0.. into out_ptr[:D], BLOCK_S splits at a time (a running
    max); CG reads around L1 (FUSED: other programs of this launch wrote them)."""
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)
    total = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_mask = offs_s < num_splits
        lse_ptrs = part_lse_ptr + row0 + offs_s
        o_ptrs = part_out_ptr + (row0 + offs_s)[:, None] * HEAD_DIM + offs_d[None, :]
        o_mask = s_mask[:, None] & d_mask[None, :]
        if CG:
            lse = tl.load(lse_ptrs, mask=s_mask, other=float("-inf"), cache_modifier=".cg")
            o = tl.load(o_ptrs, mask=o_mask, other=0.0, cache_modifier=".cg")
        else:
            lse = tl.load(lse_ptrs, mask=s_mask, other=float("-inf"))
            o = tl.load(o_ptrs, mask=o_mask, other=0.0)
        # split 0 is never empty, so m is finite from the first chunk on
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        alpha = tl.exp2(m - m_new)
        weights = tl.exp2(lse - m_new)
        acc = acc * alpha + tl.sum(o * weights[:, None], axis=0)
        total = total * alpha + tl.sum(weights, axis=0)
        m = m_new
    tl.store(out_ptr + offs_d, (acc / total).to(out_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def decode_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_valid_ptr,
    num_splits,
    stride_os,
    stride_oh,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_LIMIT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if HAS_LIMIT:
        if seq >= tl.load(num_valid_ptr):
            return
    combine_head(
        part_out_ptr, part_lse_ptr, out_ptr + seq * stride_os + head * stride_oh,
        (seq * NUM_Q_HEADS + head) * num_splits, num_splits, False, HEAD_DIM, BLOCK_S, BLOCK_D,
    )  # fmt: skip
