"""spec_bench --rounds N: each mode's engine in a child process of its own, rounds alternating.

A host-bound run (the tiny model, batch 1) moves by ~0.5 ms a step from one process to the next
and with an engine's place in its process (docs/benchmarks.md, 2026-12-02), as much as the
difference speculation makes. So here one child process generates the matching workload's
continuations, then every round runs one child with speculation off and one with it on (off
first in even rounds, on first in odd ones), and each printed row is the run of median time over
the rounds for its (workload, batch, mode). With --isolate-rows every (workload, batch) gets
its own pair of children per round (an engine that served a workload first runs slower: below).
The children are `python -m troupe.ops.spec_isolated
JOB FOLDER OUT -- <spec_bench arguments>`; they share the model folder the parent wrote.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from troupe.ops.spec_bench import (
    Row,
    bench_configs,
    bench_prompts,
    parse_args,
    pick,
    print_speedups,
    run_batches,
    write_models,
)

JOBS = ("generate", "off", "on")


def _bench_argv(argv: list[str]) -> list[str]:
    """spec_bench's arguments without --rounds (a child runs one engine)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--rounds":
            skip = True
        elif not arg.startswith("--rounds="):
            out.append(arg)
    return out


def _child(job: str, folder: Path, out: Path, args: argparse.Namespace) -> None:
    """One engine: the continuations (generate), or every workload with speculation off / on."""
    base, nonmatching = bench_prompts(args)
    off, on, mode = bench_configs(args, folder)
    if job == "generate":
        _, docs = run_batches(off, "off", {"generate": base}, args)
        out.write_text(json.dumps(docs))
        return
    docs = json.loads((folder / "docs.json").read_text())
    matching = [p + c + p for p, c in zip(base, docs, strict=True)]
    config, name = (off, "off") if job == "off" else (on, mode)
    both = pick(args, {"matching": matching, "nonmatching": nonmatching})
    rows, _ = run_batches(config, name, both, args)
    out.write_text(json.dumps([dataclasses.asdict(row) for row in rows]))


def _spawn(job: str, folder: Path, out: Path, bench_argv: list[str]) -> None:
    command = [sys.executable, "-m", "troupe.ops.spec_isolated", job, str(folder), str(out)]
    subprocess.run([*command, "--", *bench_argv], check=True)


def run_isolated(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The whole comparison in child processes; prints the rows and speedups as spec_bench."""
    bench_argv = _bench_argv(list(sys.argv[1:] if argv is None else argv))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_models(args, folder)
        _spawn("generate", folder, folder / "docs.json", bench_argv)
        runs: dict[tuple[str, int, str], list[Row]] = {}
        # --isolate-rows: one child per (workload, batch) and mode, so no row runs in an
        # engine that served another first (that history alone moved a host-bound step by
        # 0.3-0.4 ms on the H200, docs/benchmarks.md session 12)
        parts: list[list[str]] = [[]]
        if args.isolate_rows:
            names = [args.workload] if args.workload else ["matching", "nonmatching"]
            parts = [["--workload", w, "--row-batch", str(b)] for w in names for b in args.batches]
        for round_no in range(args.rounds):
            order = ("off", "on") if round_no % 2 == 0 else ("on", "off")
            for part_no, part in enumerate(parts):
                for job in order:
                    out = folder / f"{job}-{round_no}-{part_no}.json"
                    _spawn(job, folder, out, [*bench_argv, *part])
                    for fields in json.loads(out.read_text()):
                        row = Row(**fields)
                        runs.setdefault((row.workload, row.batch, row.mode), []).append(row)
    print(f"\nmedian-time run of {args.rounds} rounds, each mode in its own processes:")
    chosen = []
    for found in runs.values():
        found.sort(key=lambda row: row.seconds)
        chosen.append(found[len(found) // 2])
        print(chosen[-1].line())
    print_speedups(chosen, "draft" if args.draft else "ngram")
    return 0


def main() -> None:
    job, folder, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    assert job in JOBS and sys.argv[4] == "--", f"usage: JOB FOLDER OUT -- ARGS, got {sys.argv}"
    _child(job, folder, out, parse_args(sys.argv[5:]))


if __name__ == "__main__":
    main()
