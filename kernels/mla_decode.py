"""Triton multi-head latent attention over the paged latent cache, absorbed form, one pass.

Every query row t (a decode token, or a prefill token attending causally) attends to the first
ctx[t] tokens of sequence seq[t]. The query comes in already absorbed into the latent space
(gpu/mla_layer.py: q_lat,h = W_uk,h^T q_nope,h), so all heads score against the same cached
row [c | k_r] and a program reads each latent row once for BLOCK_H heads:

    cache [blocks, block_size, 1, L + R]           slot = block * block_size + offset
    score[h, n] = (q_lat[h] . c[n] + q_rope[h] . k_r[n]) * scale
    o_lat[h]    = softmax(score[h]) @ c             [T, H, L]; the caller applies W_uv

The kernel (kernels/mla_decode_paged.py), grid (row, head block, split): a split streams its
slice of the context in BLOCK_N tiles of whole pages (the next tile's block ids loaded an
iteration early) with an online softmax (base 2). One split writes o_lat directly; more write
partial outputs (in the output dtype) and log-sum-exps, and the last split of a row to finish
merges them (kernels/mla_split_merge.py: per-row arrival counters the kernel leaves zeroed).
Splits cut the context by the row's own ctx (read from the device), the grid depends on shapes
only: no host sync, so a CUDA graph captures it. MlaLaunch holds the launch parameters;
DEFAULT_CONFIG is the one the engine runs (ops/mla_variant_sweep.py times the candidates).
The variants that lost to it on the H200 (heads-as-M, tokens-as-M, TMA, the register prefetch,
two column programs, q reloaded, register caps, fp32 partials and the separate merge launch)
were removed; their figures are in docs/benchmarks.md.
"""

# Triton kernels take untyped pointers and constexprs; @triton.jit is untyped to mypy.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import dataclasses

import torch
import triton

from .arrival import arrival_counters
from .mla_decode_paged import mla_split_paged_kernel
from .sm_count import num_sms

_LOG2E = 1.4426950408889634


@dataclasses.dataclass(frozen=True)
class MlaLaunch:
    """Launch parameters; ops/mla_bench.py sweeps them."""

    block_h: int = 16
    block_n: int = 32
    num_warps: int = 4
    num_stages: int = 2
    programs_per_sm: int = 4  # the split count aims at this many programs per SM


# The launch the engine runs (kernels/mla_ops.py): set it to the BEST line of
# `python3 -m troupe.ops.mla_bench --sweep-variants` (H200 2026-12-02 16:23, 256 x 1,024: this
# one 90.7 us, 81% of copy; bn 32 st 3 pps 4 102.1 us, 72%).
DEFAULT_CONFIG = MlaLaunch(
    block_n=64,
    num_warps=4,
    num_stages=2,
    programs_per_sm=3,
)


def choose_num_splits(
    num_rows: int, num_head_blocks: int, max_context: int, num_sms: int, programs_per_sm: int = 4
) -> int:
    """Splits so that about programs_per_sm programs run per SM, each over >= 128 tokens of the
    longest context the table can hold (shapes only: a CUDA graph replays the same launch)."""
    programs = num_rows * num_head_blocks
    wanted = max(1, (programs_per_sm * num_sms) // max(programs, 1))
    return max(1, min(wanted, max_context // 128, 16))


def mla_attention_triton(
    q_lat: torch.Tensor,
    q_rope: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    row_seq: torch.Tensor,
    row_ctx: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    config: MlaLaunch = DEFAULT_CONFIG,
) -> torch.Tensor:
    """o_lat [T, H, L] in q_lat's dtype for q_lat [T, H, L], q_rope [T, H, R] over cache
    [blocks, block_size, 1, L + R]; row t sees the first row_ctx[t] tokens of sequence
    row_seq[t] (both int32 [T] on the device; ctx 0 gives zeros)."""
    num_rows, num_heads, latent = q_lat.shape
    rope = q_rope.shape[2]
    block_size = cache.shape[1]
    assert cache.shape[-1] == latent + rope, f"cache rows {cache.shape[-1]} != {latent} + {rope}"
    assert cache.is_contiguous(), "the latent cache must be contiguous"
    assert q_lat.stride(2) == 1 and q_rope.stride(2) == 1, "head rows must be contiguous"
    out = torch.empty(num_rows, num_heads, latent, dtype=q_lat.dtype, device=q_lat.device)
    if num_rows == 0:
        return out
    block_h = max(16, min(config.block_h, triton.next_power_of_2(num_heads)))
    head_blocks = triton.cdiv(num_heads, block_h)
    if num_splits is None:
        max_context = block_tables.shape[1] * block_size
        num_splits = choose_num_splits(
            num_rows, head_blocks, max_context, num_sms(q_lat.device), config.programs_per_sm
        )
    part_out = part_lse = out  # unused with one split
    if num_splits > 1:
        part_out = torch.empty(
            num_rows, num_heads, num_splits, latent, dtype=q_lat.dtype, device=q_lat.device
        )
        part_lse = torch.empty(
            num_rows, num_heads, num_splits, dtype=torch.float32, device=q_lat.device
        )
    block_l = max(16, triton.next_power_of_2(latent))
    # more than one split: the last split of a row merges (kernels/mla_split_merge.py)
    counters = arrival_counters(num_rows * head_blocks, q_lat.device) if num_splits > 1 else row_ctx
    block_r = max(16, triton.next_power_of_2(rope))
    precision = "ieee" if q_lat.dtype == torch.float32 else "tf32"
    mla_split_paged_kernel[(num_rows, head_blocks, num_splits)](
        q_lat, q_rope, cache, out, part_out, part_lse, block_tables, row_seq, row_ctx,
        counters, scale * _LOG2E,
        q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0),
        NUM_HEADS=num_heads, BLOCK_SIZE=block_size, LATENT=latent, ROPE=rope,
        BLOCK_H=block_h, BLOCK_L=block_l, BLOCK_R=block_r, BLOCK_N=config.block_n,
        NUM_SPLITS=num_splits, PRECISION=precision,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out
