"""Where the GPU's time goes in the offline run (issue 9, point 4): the nano-vllm workload of
ops/bench_offline.py through troupe.Engine under torch.profiler (CUDA activity only), then

    busy / idle   the union of kernel and copy intervals against the run's span on the GPU
    gaps          idle intervals by length (a graph replay's kernels sit back to back; a gap
                  of tens of us is the host: planning, launching, a sync, the next step's
                  inputs), and the long ones by the kernels before and after them
    kernels       the top kernels by total time (CUDA graph replays list their kernels)
    tenths        idle time per tenth of the run (prefill-heavy start vs decode tail)

Only the timed region counts: the events of the last `elapsed` seconds of GPU time (the engine's
start, weight upload, graph capture and warm-up come before it).

    python -m troupe.ops.step_timeline [--num-seqs 256] [--max-num-batched-tokens 16384]

The profiler's activity tracing slows the host (the profiled run is ~2.5x slower on the H200),
so its idle gaps are mostly the profiler's own; kernel durations are not. The run is therefore
made twice: unprofiled (its wall time) and profiled (its kernels); the unprofiled run's GPU idle
is then about wall - busy, printed per step with the kernels' share by family.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch._C._autograd import DeviceType
from troupe.gpu.weights import qwen3_0_6b_config
from troupe.ops import bench_offline

Interval = tuple[int, int, str]  # start ns, duration ns, name
GAP_BUCKETS_US = ((0, 5), (5, 20), (20, 100), (100, 1000), (1000, 10**9))
LONG_GAP_NS = 100_000  # gaps listed by their neighbours: a step's host work not overlapped


def gpu_intervals(prof: Any) -> list[Interval]:
    """Every CUDA kernel, copy and set of the profile, sorted by start."""
    out = [
        (e.start_ns(), e.duration_ns(), e.name())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == DeviceType.CUDA
    ]
    out.sort()
    return out


def summarize(events: list[Interval], top: int = 25) -> list[str]:
    """The report's lines (module docstring)."""
    if not events:
        return ["no GPU events recorded"]
    first, end = events[0][0], events[0][0]
    busy, gaps = 0, []
    by_name: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    around: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])  # long gaps
    last = ""
    for start, dur, name in events:
        by_name[name[:70]][0] += dur
        by_name[name[:70]][1] += 1
        if start > end:
            gaps.append((end, start - end))
            busy += dur
            if start - end >= LONG_GAP_NS:
                around[last, name[:40]][0] += start - end
                around[last, name[:40]][1] += 1
        else:
            busy += max(0, start + dur - end)
        if start + dur >= end:
            last = name[:40]
        end = max(end, start + dur)
    span = end - first
    idle = span - busy
    lines = [f"GPU span {span / 1e9:.3f} s, busy {busy / 1e9:.3f} s, idle {idle / 1e9:.3f} s "
             f"({idle / span:.1%})"]  # fmt: skip
    for lo, hi in GAP_BUCKETS_US:
        sel = [g for _, g in gaps if lo * 1000 <= g < hi * 1000]
        lines.append(f"gaps {lo}-{hi} us: {len(sel)}, {sum(sel) / 1e6:.1f} ms")
    kernel_total = sum(v[0] for v in by_name.values())
    for name, (dur, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{dur / 1e6:9.1f} ms {dur / kernel_total:6.1%} x{count:<7d} {name}")
    lines.append(f"gaps of {LONG_GAP_NS // 1000} us or more, by the kernels around them:")
    for (before, after), (ns, count) in sorted(around.items(), key=lambda kv: -kv[1][0])[:8]:
        lines.append(f"  {ns / 1e6:7.1f} ms x{count:<5d} {before} -> {after}")
    tenth = span / 10
    per = [0.0] * 10
    for at, gap in gaps:
        per[min(int((at - first) / tenth), 9)] += gap
    lines.append("idle per tenth of the run (ms): " + " ".join(f"{x / 1e6:.0f}" for x in per))
    return lines


FAMILIES = (  # (label, substrings of kernel names), first match wins
    ("decode attention", ("_decode_split", "decode_reduce", "_decode_fp8")),
    ("prefill attention", ("_paged_attention",)),
    ("GEMMs", ("nvjet", "gemm", "gemv", "splitKreduce", "cutlass", "_int4", "_fp8_cols")),
    ("sampling", ("gumbel", "reduce_kernel", "argmax", "softmax")),
    ("copies", ("Memcpy", "Memset")),
)


def by_family(events: list[Interval]) -> dict[str, int]:
    """Kernel ns per family (FAMILIES; the rest: "other")."""
    out: dict[str, int] = defaultdict(int)
    for _, dur, name in events:
        label = next((f for f, keys in FAMILIES if any(k in name for k in keys)), "other")
        out[label] += dur
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--num-kv-blocks", type=int, help="default: sized from free memory")
    args = parser.parse_args()
    options = {} if args.num_kv_blocks is None else {"num_kv_blocks": args.num_kv_blocks}
    args.enforce_eager = False
    prompts, outputs = bench_offline.workload(args.num_seqs, seed=0)
    config = qwen3_0_6b_config()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bench_offline.write_model_folder(folder, config)
        bench_offline.run_engine(folder, prompts, outputs, args, **options)
        wall = bench_offline.run_engine.elapsed  # type: ignore[attr-defined]
        activities = [torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            total = bench_offline.run_engine(folder, prompts, outputs, args, **options)
    elapsed = bench_offline.run_engine.elapsed  # type: ignore[attr-defined]
    print(f"profiled run: {total:,} tokens in {elapsed:.2f} s, {total / elapsed:,.0f} tok/s")
    start = time.perf_counter()
    events = gpu_intervals(prof)
    print(f"{len(events):,} GPU events, read in {time.perf_counter() - start:.1f} s")
    if events:
        last = max(at + dur for at, dur, _ in events)
        events = [e for e in events if e[0] >= last - elapsed * 1e9]
    print("\n".join(summarize(events)))
    families = by_family(events)
    busy = sum(families.values()) / 1e9
    print(f"unprofiled run: {wall:.3f} s; kernels {busy:.3f} s; GPU idle about "
          f"{wall - busy:.3f} s ({(wall - busy) / wall:.1%})")  # fmt: skip
    for label, ns in sorted(families.items(), key=lambda kv: -kv[1]):
        print(f"  {label:<18} {ns / 1e9:7.3f} s {ns / 1e9 / wall:6.1%} of the unprofiled wall")


if __name__ == "__main__":
    main()
