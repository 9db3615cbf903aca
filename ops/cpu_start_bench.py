"""The CPU default's start, alone: Engine.open in fresh subprocesses, wall and CPU time.

    python -m troupe.ops.cpu_start_bench                  # 5 runs, default model, 2 threads
    python -m troupe.ops.cpu_start_bench --runs 3 --profile start.prof   # + cProfile (1st run)

Each run is a new interpreter that imports troupe, the engine and torch (as `cpu_bench` does
before its clock starts), then times `Engine.open` up to ready, as `cpu_bench`'s "start"
column does. It prints, per run: the wall seconds, the process's CPU seconds (user + sys of
every thread, from getrusage) over the same span, the peak RSS of the process (ru_maxrss) at
ready and the RSS then, and the load average. CPU time is the figure to compare on a shared
machine: it does not count time spent waiting for a core.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mib() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(model: str | None, threads: int, profile: str | None) -> dict[str, Any]:
    import anyio
    import torch
    from troupe import Engine, EngineConfig

    torch.set_num_threads(threads)
    config = EngineConfig(model=model, device="cpu")
    out: dict[str, Any] = {"import_cpu_s": cpu_seconds(), "import_rss_mib": rss_mib()}

    async def main() -> None:
        wall0, cpu0 = time.perf_counter(), cpu_seconds()
        async with Engine.open(config):
            out["wall_s"] = time.perf_counter() - wall0
            out["cpu_s"] = cpu_seconds() - cpu0
            out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            out["rss_mib"] = rss_mib()

    if profile:
        import cProfile

        with cProfile.Profile() as prof:
            anyio.run(main)
        prof.dump_stats(profile)
    else:
        anyio.run(main)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a .gguf file (default: the default model)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", default=None, help="cProfile the first run into this file")
    parser.add_argument("--json", default=None, help="write the runs here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.model, args.threads, args.profile)), flush=True)
        return
    runs = []
    for i in range(args.runs):
        cmd = [sys.executable, "-m", "troupe.ops.cpu_start_bench", "--child"]
        cmd += ["--threads", str(args.threads)] + (["--model", args.model] if args.model else [])
        if args.profile and i == 0:
            cmd += ["--profile", args.profile]
        load = os.getloadavg()[0]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            sys.exit(f"run {i} failed:\n{proc.stderr[-3000:]}")
        run = json.loads(lines[-1][len("RESULT ") :]) | {"load": load}
        runs.append(run)
        print(
            f"run {i}: start {run['wall_s']:.2f} s wall, {run['cpu_s']:.2f} s CPU | "
            f"peak RSS {run['peak_rss_mib']:.0f} MiB, RSS at ready {run['rss_mib']:.0f} MiB "
            f"(after imports {run['import_rss_mib']:.0f}) | load {load:.1f}"
            + (" (profiled)" if args.profile and i == 0 else ""),
            flush=True,
        )
    timed = runs[1:] if args.profile and len(runs) > 1 else runs
    for key in ("wall_s", "cpu_s", "peak_rss_mib"):
        values = [r[key] for r in timed]
        print(
            f"{key}: median {statistics.median(values):.2f}, min {min(values):.2f}, "
            f"max {max(values):.2f} ({len(values)} runs)"
        )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(runs, file, indent=1)


if __name__ == "__main__":
    main()
