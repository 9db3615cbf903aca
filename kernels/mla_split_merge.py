"""The split merge done by the last split of a row, inside the MLA decode kernel.

With split-K over the context, the kernel (kernels/mla_decode_paged.py) writes per-split
partial outputs and log-sum-exps; instead of a second launch merging them, every split
program, after writing its partials, bumps a per-(row, head block) arrival counter; the one
that arrives last (count == NUM_SPLITS - 1) merges the row's partials and writes o_lat, then
sets the counter back to 0. So the counters are all zero between launches: one zeroed buffer
per device serves every launch and every CUDA-graph replay (nothing is allocated or reset on
the host per call, and the merge launch with its tail goes away).

Ordering: the partial stores of all threads, a CTA barrier, then one acq_rel atomic at GPU
scope (release of this CTA's stores, acquire of the earlier arrivals'); the merging program
reads the partials with .cg loads (L2, never a stale L1 line).

merge_if_last_rolled keeps its loops over the splits as loops and merges 128 columns at a time,
so the merge does not raise the kernel's register count with the split count (triton 3.7 for
sm_90, PAGED bn 32 w4: 128 registers at 2 splits; a merge unrolled over the splits, holding a
[BLOCK_H, BLOCK_L] fp32 sum, took 178 at 4 and 194 at 8; it was removed with the variants that
used it).
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import triton
import triton.language as tl

from .arrival import reset_arrival


@triton.jit
def merge_if_last_rolled(
    counter_ptr,
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    row,
    heads,
    h_mask,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    LATENT: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    """Called by every split program after it stored its partials: the last to arrive merges
    the BLOCK_H heads' NUM_SPLITS partials into out, 128 columns at a time with runtime loops
    over the splits (the module docstring says why), and resets the counter."""
    tl.debug_barrier()
    count = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if count == NUM_SPLITS - 1:
        PIECE: tl.constexpr = 128 if BLOCK_L > 128 else BLOCK_L
        first = (row * NUM_HEADS + heads.to(tl.int64)) * NUM_SPLITS  # [BLOCK_H]
        top = tl.full([BLOCK_H], float("-inf"), tl.float32)
        for s in range(NUM_SPLITS):
            lse = tl.load(
                part_lse_ptr + first + s, mask=h_mask, other=float("-inf"), cache_modifier=".cg"
            )
            top = tl.maximum(top, lse)
        top = tl.where(top > float("-inf"), top, 0.0)
        out_rows = out_ptr + row * stride_ot + heads[:, None].to(tl.int64) * stride_oh
        for l0 in tl.static_range(0, BLOCK_L, PIECE):
            offs_l = l0 + tl.arange(0, PIECE)
            mask = h_mask[:, None] & (offs_l < LATENT)[None, :]
            total = tl.zeros([BLOCK_H], tl.float32)
            acc = tl.zeros([BLOCK_H, PIECE], tl.float32)
            for s in range(NUM_SPLITS):
                lse = tl.load(part_lse_ptr + first + s, mask=h_mask, other=float("-inf"),
                              cache_modifier=".cg")  # fmt: skip
                w = tl.where(lse > float("-inf"), tl.math.exp2(lse - top), 0.0)
                src = part_out_ptr + (first + s)[:, None] * LATENT + offs_l[None, :]
                part = tl.load(src, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
                acc += part * w[:, None]
                total += w
            o = acc / tl.where(total > 0, total, 1.0)[:, None]
            tl.store(out_rows + offs_l[None, :], o.to(out_ptr.dtype.element_ty), mask=mask)
        reset_arrival(counter_ptr)
