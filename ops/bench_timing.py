"""How the kernel benchmarks time a call on the GPU (ops/kernel_bench.py and the benches that
share its figures: fp8_kv_bench, moe_bench, mla_bench, extend_sweep): the median of eager calls,
the median of CUDA graph replays, and graph replays with L2 flushed before each call as a
decode layer finds it in the engine.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton.testing


def median_ms(fn: object) -> float:
    return float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median"))


def graph_ms(fn: object) -> float:
    """Median ms per call replayed from a CUDA graph (no launch cost, L2 not flushed)."""
    return float(triton.testing.do_bench_cudagraph(fn, rep=300, return_mode="median"))


def flushed_graph_ms(
    fn: Callable[[], object], calls: int = 20, replays: int = 15, dirty: bool = False
) -> float:
    """Median ms per call replayed from a CUDA graph with L2 flushed before each call by reading
    256 MiB, as a decode layer finds it in the engine (the weights and KV that the work before
    it read, clean); `dirty`: by writing them (every line dirty). A graph of (flush, call) x
    `calls` less a graph of the flushes alone."""
    scratch = torch.empty(256 * 2**20 // 8, dtype=torch.int64, device="cuda")  # > the H200's L2
    total = torch.empty((), dtype=torch.int64, device="cuda")
    fn()
    torch.cuda.synchronize()

    def capture(with_call: bool) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                if dirty:
                    scratch.zero_()
                else:
                    torch.sum(scratch, dim=0, out=total)
                if with_call:
                    fn()
        return graph

    def replay_ms(graph: torch.cuda.CUDAGraph) -> float:
        graph.replay()  # warm
        times = []
        for _ in range(replays):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        return sorted(times)[len(times) // 2]

    both, flushes = capture(True), capture(False)
    return (replay_ms(both) - replay_ms(flushes)) / calls
