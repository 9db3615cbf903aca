"""The fp8-KV decode kernel as an H200 would run it, measured on an H100 (issue 12).

    python -m troupe.ops.h200_standin [--sweep] [--sms 96] [--distinct-blocks 256]
    python -m troupe.ops.h200_standin --int4 [--sms 96]   # quant_bench's batch-1 chain
    python -m troupe.ops.h200_standin --sweep --repeat 5    # medians of 5 timings a row

An H100 SXM and an H200 are one die (132 SMs, the same clocks, the same HBM latency); the
H200's HBM only moves 1.4x more (4.26 TB/s against ~3.0). So an H200 SM must keep 1.4x the
bytes in flight that an H100 SM needs at its copy rate, and a kernel at 95% of an H100's copy
can sit at 74% on the H200 (the fp8 form: session 40). Each row times one launch at the decode
shapes of fp8_kv_bench (the same grid, splits and tiles) three ways:

    HBM       the whole card, L2 flushed before each call (fp8_kv_bench's graph rows)
    L2        every block table folded into `--distinct-blocks` blocks that stay in L2
              (256: 8 MiB in fp8): what the instructions allow when memory is never the limit
    N SMs     a green context of `--sms` SMs (96 ~ 132 x 3.0 / 4.26) with the split policy told
              so: each SM must pull the share of HBM an H200 SM pulls at its copy rate;
              "as H200" is that per-SM rate against the H200's (4.26 TB/s / 132)

Rates count K and V once per token, in the cache's bytes. The candidates are
fp8_variant_sweep.CANDIDATES (with the bf16 cache's row), or SWEEP's launches of the default
form (`--sweep`). `--int4`: issue 16's chain instead (ops/quant_bench.py: the Llama-3.1-8B
linears at one row, int4 and bf16, graph replays), on the whole card and on the SMs' share.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
import triton.testing
from troupe.kernels import arrival, decode_attention
from troupe.kernels.decode_attention import DecodeConfig, paged_decode_attention_triton
from troupe.kernels.paged_batch import PADDING_BLOCK_ID, PagedBatch
from troupe.ops.bench_offline import HBM_BYTES_PER_S
from troupe.ops.bench_timing import flushed_graph_ms, graph_ms
from troupe.ops.card_rates import copy_bandwidth
from troupe.ops.fp8_variant_sweep import CANDIDATES, SHAPES, describe, fp8_decode_batch

H200_SMS = 132
# --sweep: the default form (converted at the dot) by how many K/V tiles are in flight. Its
# loads are indirect (the page ids first), so Triton's pipeliner gives the tiles
# ceil((num_stages - 2) / 2) buffers: one at 3 and 4 stages, two at 5 and 6, three at 7 (the
# TTGIR, triton 3.6 and 3.7.1). Session 46's sweeps (launch widths at 3-4 stages, none past 80%
# as H200; then 64 / 2 / 5, two buffers, at 83-84%, the default since) and session 47's two (32
# / 1 / 5, 32 / 1 / 7, 64 / 1 / 5, 5 splits' worth of programs; then the launches below: 6
# stages build the same two buffers, 4 warps lose 12-19 points, 3 or 6 splits' worth lose at
# 16 x 16,384; none ahead of the default) are in docs/benchmarks.md. The first row is the
# default: the others' outputs are checked against it.
SWEEP = [
    DecodeConfig(bn, w, st, programs_per_sm=waves)
    for bn, w, st, waves in (
        (64, 2, 5, 4), (64, 2, 6, 4), (64, 4, 5, 4), (64, 4, 6, 4), (64, 2, 5, 3), (64, 2, 5, 6),
    )
]  # fmt: skip


def folded_tables(block_tables: torch.Tensor, distinct: int) -> torch.Tensor:
    """The same tables with every block id folded into the first `distinct` blocks."""
    return torch.where(block_tables == PADDING_BLOCK_ID, block_tables, block_tables % distinct)


class SmShare:
    """A green context of `sms` SMs, entered around calls, the split policies (decode attention,
    the GEMVs' K splits) told so."""

    def __init__(self, sms: int) -> None:
        from torch.cuda.green_contexts import GreenContext

        self.sms = sms
        self.context: Any = GreenContext.create(num_sms=sms, device_id=torch.cuda.current_device())

    def run(self, fn: Callable[[], float]) -> float:
        def counted(device: torch.device) -> int:
            return self.sms

        with (
            mock.patch.object(decode_attention, "num_sms", counted),
            mock.patch.object(arrival, "num_sms", counted),
        ):
            self.context.set_context()
            try:
                return fn()
            finally:
                self.context.pop_context()

    def as_h200(self, rate: float) -> float:
        """A rate reached on the share, per SM, as a fraction of an H200 SM's share of HBM."""
        return rate / self.sms / (HBM_BYTES_PER_S / H200_SMS)


def rates(
    batch: PagedBatch, k: torch.Tensor, v: torch.Tensor, scales: torch.Tensor | None,
    config: DecodeConfig, folded: torch.Tensor, share: SmShare,
) -> tuple[torch.Tensor, float, float, float]:  # fmt: skip
    """The launch's output, and its KV bytes per second: the whole card (HBM), from L2, on
    share's SMs."""

    def call(block_tables: torch.Tensor = batch.block_tables) -> torch.Tensor:
        return paged_decode_attention_triton(
            batch.q, k, v, block_tables, batch.seq_lens, 1 / math.sqrt(128), batch.max_seq_len,
            config=config, k_scale=scales, v_scale=scales,
        )  # fmt: skip

    def eager_flushed() -> float:  # do_bench clears L2 before each call
        return float(triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median"))

    tokens = int(batch.seq_lens.sum())
    nbytes = 2 * tokens * 8 * 128 * k.element_size() + 4 * batch.q.numel()
    out = call().float()
    ms = (flushed_graph_ms(call), graph_ms(lambda: call(folded)), share.run(eager_flushed))
    return out, nbytes / (ms[0] * 1e-3), nbytes / (ms[1] * 1e-3), nbytes / (ms[2] * 1e-3)


def int4_chain(share: SmShare, layers: int) -> None:
    """quant_bench's batch-1 step, int4 and bf16, on the whole card and on the share."""
    from troupe.kernels.quant_int4 import Int4Cols, int4_cols_matmul
    from troupe.ops.quant_bench import HIDDEN, INTER, timed, weights

    device = torch.device("cuda")
    torch.manual_seed(0)
    dense, int4, _ = weights(layers, device)
    cols = [Int4Cols.from_rows(*w) for w in int4]
    nbytes = sum(p.numel() + s.numel() * 2 + b.numel() * 2 for p, s, b in int4)
    xs = {k: torch.randn(1, k, device=device, dtype=torch.bfloat16) for k in (HIDDEN, INTER)}

    def step_int4() -> None:
        for w in cols:
            int4_cols_matmul(xs[w.shape[1]], w)

    def step_bf16() -> None:
        for w in dense:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    steps: list[tuple[str, Callable[[], None]]] = [("bf16", step_bf16), ("int4", step_int4)]
    for name, step in steps:
        whole = timed(step, device)
        part = share.run(functools.partial(timed, step, device))
        size = nbytes if name == "int4" else sum(w.numel() * 2 for w in dense)
        as_h200 = share.as_h200(size / part)
        print(f"{name}: whole card {whole * 1e3:.3f} ms ({size / whole / 1e12:.2f} TB/s); "
              f"{share.sms} SMs {part * 1e3:.3f} ms ({size / part / 1e12:.2f} TB/s, "
              f"{as_h200:.0%} as H200)", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--distinct-blocks", type=int, default=256)
    parser.add_argument("--sms", type=int, default=96)
    parser.add_argument("--sweep", action="store_true", help="fp8 at the dot: SWEEP's launches")
    parser.add_argument("--int4", action="store_true", help="quant_bench's int4 chain instead")
    parser.add_argument("--layers", type=int, default=32, help="--int4: decoder layers")
    parser.add_argument("--repeat", type=int, default=1, help="time each row N times: medians")
    args = parser.parse_args()
    candidates = [("fp8", c) for c in SWEEP] if args.sweep else CANDIDATES
    share = SmShare(args.sms)
    if args.int4:
        int4_chain(share, args.layers)
        return
    whole, part = copy_bandwidth(), share.run(copy_bandwidth)
    print(f"{torch.cuda.get_device_name()}; L2 pool {args.distinct_blocks} blocks; copy "
          f"{whole / 1e12:.2f} TB/s, on {args.sms} SMs {part / 1e12:.2f}")  # fmt: skip
    print(f"{'kind':<5} {'config':<40} {'shape':<9} {'HBM':>6} {'L2':>6} "
          f"{f'{args.sms} SMs':>7} {'as H200':>8} {'vs row 1':>9}   (TB/s)")  # fmt: skip
    for num_seqs, context in SHAPES:
        batch, k8, v8, scales = fp8_decode_batch(num_seqs, context)
        folded = folded_tables(batch.block_tables, args.distinct_blocks)
        first: dict[str, torch.Tensor] = {}  # each kind's first row's output
        for kind, config in candidates:
            k, v, s = (batch.k_cache, batch.v_cache, None) if kind == "bf16" else (k8, v8, scales)
            try:
                runs = [rates(batch, k, v, s, config, folded, share) for _ in range(args.repeat)]
            except Exception as exc:  # a launch that does not build is a row, not the end
                print(f"FAILED {kind} {describe(config)}: {type(exc).__name__}: {exc}"[:300])
                continue
            out = runs[0][0]
            columns = list(zip(*((hbm, l2, part) for _, hbm, l2, part in runs), strict=True))
            hbm, l2, part = (statistics.median(column) for column in columns)
            spread = share.as_h200(max(columns[2])) - share.as_h200(min(columns[2]))
            ref = first.setdefault(kind, out)
            diff = float((out - ref).norm() / ref.norm())  # relative; > 1e-2 is a wrong launch
            print(
                f"{kind:<5} {describe(config):<40} {num_seqs}x{context:<6} {hbm / 1e12:6.2f} "
                f"{l2 / 1e12:6.2f} {part / 1e12:7.2f} {share.as_h200(part):8.0%} {diff:9.1e}"
                + (
                    f"  (as H200 spread {spread:.0%} over {args.repeat})" if args.repeat > 1 else ""
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
