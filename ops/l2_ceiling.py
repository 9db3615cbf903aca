"""The fp8-KV decode kernel with memory faster than HBM: an H200 stand-in on an H100 (issue 12).

    python -m troupe.ops.l2_ceiling [--distinct-blocks 256]

An H100 SXM and an H200 are one die (132 SMs, the same clocks); the H200 only moves HBM 1.4x
faster (4.26 TB/s against ~3.0). A decode kernel at 95% of an H100's copy rate may therefore be
one that could go no faster: on the H200 the fp8 form runs at 74% (~3.15 TB/s) where the H100
gives it 85-95%. This bench tells the two apart without an H200: each launch reads the decode
shapes' full logical KV (the same grid, splits and tiles as fp8_kv_bench's), but every
sequence's block table points into a pool of `--distinct-blocks` blocks that stays in L2
(256 blocks: 8 MiB in fp8, 16 MiB in bf16), so the rate a launch reaches is what its
instructions and latencies allow, not what HBM serves. Beside it, the same launch over distinct
blocks (L2 flushed before each call, as fp8_kv_bench's graph rows). Rates count K and V once
per token read, in the cache's bytes; % of the 4.26 TB/s an H200 copies.

A form whose L2 rate stays under ~3.8 TB/s cannot give issue 12's 90% on an H200, whatever it
does on an H100; the candidates are fp8_variant_sweep.CANDIDATES.
"""

from __future__ import annotations

import argparse
import math

import torch
from troupe.kernels.decode_attention import DecodeConfig, paged_decode_attention_triton
from troupe.kernels.paged_batch import PADDING_BLOCK_ID, PagedBatch
from troupe.ops.bench_timing import flushed_graph_ms, graph_ms
from troupe.ops.fp8_variant_sweep import CANDIDATES, SHAPES, describe, fp8_decode_batch

H200_COPY = 4.26e12
# --sweep: the default form (converted at the dot) over block_n / warps / stages / programs an
# SM; the fewer registers of a narrower tile buy more warps an SM to hide HBM's latency with
SWEEP = [
    DecodeConfig(bn, w, st, programs_per_sm=waves)
    for bn, w, st, waves in (
        (128, 2, 3, 3), (128, 2, 4, 4), (128, 4, 3, 4), (64, 2, 3, 4), (64, 2, 3, 8),
        (64, 2, 4, 8), (64, 1, 3, 8), (32, 1, 3, 8), (32, 1, 4, 8), (32, 2, 3, 8),
        (256, 4, 3, 4), (256, 2, 3, 4),
    )
]  # fmt: skip


def aliased(block_tables: torch.Tensor, distinct: int) -> torch.Tensor:
    """The same tables with every block id folded into the first `distinct` blocks."""
    return torch.where(block_tables == PADDING_BLOCK_ID, block_tables, block_tables % distinct)


def rate(
    batch: PagedBatch, k: torch.Tensor, v: torch.Tensor, scales: torch.Tensor | None,
    config: DecodeConfig, block_tables: torch.Tensor, in_l2: bool,
) -> float:  # fmt: skip
    """KV bytes per second of one launch (graph replays; HBM: L2 flushed before each)."""

    def call() -> torch.Tensor:
        return paged_decode_attention_triton(
            batch.q, k, v, block_tables, batch.seq_lens, 1 / math.sqrt(128), batch.max_seq_len,
            config=config, k_scale=scales, v_scale=scales,
        )  # fmt: skip

    ms = graph_ms(call) if in_l2 else flushed_graph_ms(call)
    tokens = int(batch.seq_lens.sum())
    return (2 * tokens * 8 * 128 * k.element_size() + 4 * batch.q.numel()) / (ms * 1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--distinct-blocks", type=int, default=256)
    parser.add_argument("--sweep", action="store_true", help="fp8 at the dot: SWEEP's launches")
    args = parser.parse_args()
    candidates = [("fp8", c) for c in SWEEP] if args.sweep else CANDIDATES
    print(f"{torch.cuda.get_device_name()}; KV pool in L2: {args.distinct_blocks} blocks")
    print(f"{'kind':<5} {'config':<34} {'shape':<10} {'HBM TB/s':>9} {'L2 TB/s':>8} {'L2/H200':>8}")
    for num_seqs, context in SHAPES:
        batch, k8, v8, scales = fp8_decode_batch(num_seqs, context)
        folded = aliased(batch.block_tables, args.distinct_blocks)
        for kind, config in candidates:
            k, v, s = (batch.k_cache, batch.v_cache, None) if kind == "bf16" else (k8, v8, scales)
            try:
                hbm = rate(batch, k, v, s, config, batch.block_tables, in_l2=False)
                l2 = rate(batch, k, v, s, config, folded, in_l2=True)
            except Exception as exc:  # a launch that does not build is a row, not the end
                print(f"FAILED {kind} {describe(config)}: {type(exc).__name__}: {exc}"[:300])
                continue
            shape = f"{num_seqs}x{context}"
            print(
                f"{kind:<5} {describe(config):<34} {shape:<10} {hbm / 1e12:9.2f} "
                f"{l2 / 1e12:8.2f} {l2 / H200_COPY:8.0%}",
                flush=True,
            )


if __name__ == "__main__":
    main()
