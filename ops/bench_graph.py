"""The graph's own CPU cost: the whole engine with the fake runner, at 1, 32 and 256 sequences.

    troupe bench graph [--num-seqs N] [--executor-thread]

Each level runs N concurrent requests (16-token prompts, 256 output tokens, ignore_eos), once
with events delivered to a callback (`Engine.submit`: the graph alone) and once with one reading
task per request (`Engine.generate`, as a server has), and reports the graph's time per scheduling step (wall time minus the fake runner's own execute
time, which stands in for the GPU) and the output tokens/s through the graph.
`--executor-thread` runs the fake runner's executor in a thread of its own, as a real runner's
is (actors/thread_inbox.py), so the plan, result and mask hops are those of a GPU engine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import anyio
from troupe import Engine, EngineConfig, SamplingParams
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import StreamEvent

TARGET_MS = {1: 0.3, 256: 2.0}


async def _run_level(
    config: EngineConfig,
    num_seqs: int,
    num_tokens: int,
    consumers: str = "tasks",
    executor_thread: bool = False,
) -> dict[str, Any]:
    params = SamplingParams(max_tokens=num_tokens, ignore_eos=True, temperature=0.0)
    # an injected runner counts as blocking: its executor gets a thread of its own
    runner = FakeRunner.from_config(config) if executor_thread else None
    async with Engine.open(config, runner=runner) as engine:
        # Warm-up: one short request so tokenizer and detokenizer caches are hot.
        async for _ in engine.generate([1, 2, 3], SamplingParams(max_tokens=4)):
            pass
        steps_before = engine.stats().num_steps
        busy_before = engine.runner_busy_seconds
        actors_before = engine.actor_busy_seconds()
        start = time.perf_counter()
        counts: list[int] = []
        if consumers == "tasks":  # one reading task per request, as a server would have

            async def one(i: int) -> None:
                n = 0
                async for event in engine.generate([100 + i % 500] * 16, params):
                    n += len(event.token_ids)
                counts.append(n)

            async with anyio.create_task_group() as tg:
                for i in range(num_seqs):
                    tg.start_soon(one, i)
        else:  # Engine.submit: events to a callback, no task per request
            done = anyio.Event()
            num_done = 0

            def on_event(event: StreamEvent) -> None:
                nonlocal num_done
                counts.append(len(event.token_ids))
                if event.is_terminal:
                    num_done += 1
                    if num_done == num_seqs:
                        done.set()

            for i in range(num_seqs):
                await engine.submit([100 + i % 500] * 16, params, on_event)
            await done.wait()
        wall = time.perf_counter() - start
        with anyio.fail_after(5):
            while engine.stats().num_steps == steps_before:
                await anyio.sleep(0.001)
        steps = engine.stats().num_steps - steps_before
        busy = engine.runner_busy_seconds - busy_before
        actors = {
            name: 1000 * (t - actors_before[name]) / max(engine.stats().num_steps - steps_before, 1)
            for name, t in engine.actor_busy_seconds().items()
        }
    tokens = sum(counts)
    return {
        "num_seqs": num_seqs,
        "steps": steps,
        "ms_per_step": 1000 * (wall - busy) / max(steps, 1),
        "runner_ms_per_step": 1000 * busy / max(steps, 1),
        "tokens_per_s": tokens / wall,
        "actors_ms": actors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=None, help="one level instead of 1/32/256")
    parser.add_argument(
        "--executor-thread", action="store_true", help="the executor in a thread, as on a GPU"
    )
    args = parser.parse_args(argv)
    levels = [args.num_seqs] if args.num_seqs else [1, 32, 256]
    config = EngineConfig(
        runner="fake", max_num_seqs=max(levels), num_kv_blocks=8192, log_level="warning"
    )
    rows = []
    for num_seqs in levels:
        for consumers in ("callback", "tasks"):
            runs = [
                anyio.run(_run_level, config, num_seqs, 256, consumers, args.executor_thread)
                for _ in range(3)
            ]
            best = min(runs, key=lambda r: r["ms_per_step"])
            best["ms_per_step_median"] = statistics.median(r["ms_per_step"] for r in runs)
            best["consumers"] = consumers
            rows.append(best)
    print("consumers: callback = Engine.submit (graph only); tasks = one generate() task each")
    header = f"{'seqs':>5} {'consumers':>9} {'steps':>6} {'ms/step':>8} {'median':>8}"
    print(f"{header} {'runner':>7} {'tok/s':>10}  target")
    for r in rows:
        target = TARGET_MS.get(int(r["num_seqs"]))
        mark = ""
        if target is not None:
            mark = f"<= {target} ms " + ("ok" if r["ms_per_step"] <= target else "MISSED")
        print(
            f"{int(r['num_seqs']):>5} {r['consumers']:>9} {int(r['steps']):>6} "
            f"{r['ms_per_step']:>8.3f} {r['ms_per_step_median']:>8.3f} "
            f"{r['runner_ms_per_step']:>7.3f} {r['tokens_per_s']:>10.0f}  {mark}"
        )
    print("per-step time inside each actor's core (ms):")
    for r in rows:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in r["actors_ms"].items())
        print(f"  {int(r['num_seqs']):>4} seqs, {r['consumers']}: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
