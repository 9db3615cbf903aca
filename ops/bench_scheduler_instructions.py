"""Instructions per decode step of scheduler + allocator, counted by valgrind's callgrind.

    python -m troupe.ops.bench_scheduler_instructions [--num-seqs 256] [--steps 32]

`troupe bench scheduler` times the same steps, but a shared 2-core machine moves its figure by
+-30% from one minute to the next; an instruction count does not move at all, so two commits can
be compared in one run each, at any time. Needs valgrind and a C compiler (with valgrind's
headers): the script builds a three-function library that toggles callgrind's collection, runs
itself under callgrind with collection off, and switches it on only inside SchedulerCore.handle
and AllocatorCore.handle during `--steps` decode steps (after 8 warm ones) of the same workload
as `troupe bench scheduler` (256 sequences, 1,000-token prompts). The fake runner's time and
everything else are not counted. Instructions are not time (cache misses are not in them): use
both figures.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.gpu.fake_runner import FakeRunner
from troupe.ops import bench_scheduler

WARM_STEPS = 8
_TOGGLE_C = """#include <valgrind/callgrind.h>
void toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def count_steps(library: str, num_seqs: int, num_steps: int) -> int:
    """Run the workload with collection toggled around the cores' handle calls during
    `num_steps` decode steps; the number of steps counted (outside valgrind the toggles do
    nothing: the run is then a plain one)."""
    toggle = ctypes.CDLL(library).toggle
    counting = False
    steps = 0

    def collected(handle: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            on = counting  # fixed for the call: the step's state changes only between calls
            if on:
                toggle()
            try:
                return handle(*args, **kwargs)
            finally:
                if on:
                    toggle()

        return wrapper

    execute = FakeRunner.execute

    def execute_and_count(self, plan):  # type: ignore[no-untyped-def]
        nonlocal counting, steps
        decode = len(plan.seqs) == num_seqs and plan.num_tokens == num_seqs
        steps += decode
        counting = decode and WARM_STEPS < steps <= WARM_STEPS + num_steps
        return execute(self, plan)

    patches = [
        (SchedulerCore, "handle", collected(SchedulerCore.handle)),
        (AllocatorCore, "handle", collected(AllocatorCore.handle)),
        (FakeRunner, "execute", execute_and_count),
    ]
    saved = [(cls, name, getattr(cls, name)) for cls, name, _ in patches]
    for cls, name, fn in patches:
        setattr(cls, name, fn)
    try:
        # tokens to spare: prompts finish prefilling over several steps, and none may end inside
        bench_scheduler.measure(num_seqs, 1000, WARM_STEPS + num_steps + 64)
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    return min(num_steps, max(0, steps - WARM_STEPS))


def build_library(folder: Path) -> str:
    source, library = folder / "toggle.c", folder / "libtoggle.so"
    source.write_text(_TOGGLE_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--library", help=argparse.SUPPRESS)  # set in the run under callgrind
    args = parser.parse_args(argv)
    if args.library:
        print(f"steps {count_steps(args.library, args.num_seqs, args.steps)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        library = build_library(Path(tmp))
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no",
             f"--callgrind-out-file={tmp}/callgrind.out", sys.executable, "-P", "-m",
             "troupe.ops.bench_scheduler_instructions", "--library", library,
             "--num-seqs", str(args.num_seqs), "--steps", str(args.steps)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    collected = re.search(r"Collected : (\d+)", run.stderr)
    steps = re.search(r"steps (\d+)", run.stdout)
    if collected is None or steps is None or int(steps.group(1)) == 0:
        raise SystemExit(f"no count: {run.stdout[-500:]} {run.stderr[-500:]}")
    per_step = int(collected.group(1)) / int(steps.group(1))
    print(
        f"scheduler+allocator: {per_step:,.0f} instructions per decode step over "
        f"{steps.group(1)} steps at {args.num_seqs} running sequences, 1000-token contexts"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
