"""Where a burst's time goes, step by step (issue 9): requests all at once through Engine, the
runner wrapped in a TimedRunner (gpu/timed_runner.py), then each burst's TTFTs and its steps:

    first step    how long after the burst's start the first step began, and what it held
    prefill       the steps up to the last one carrying a prefill chunk: their span, the prompt
                  tokens per second through them, the decodes they carried
    decode        the steps after: the median period from one step's start to the next
    steps         the first --steps steps: start and end (ms after the burst's start), the gap
                  since the previous one ended, sequences, prefill chunks, tokens

Engine flags the script does not know go to the engine as `troupe serve` reads them, e.g.

    python -m troupe.ops.burst_steps --model /tmp/qwen3-random --device cuda --bursts 3
    python -m troupe.ops.burst_steps --runner fake --num-prompts 30

No profiler runs: the steps' times are the engine's own.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from collections.abc import Sequence

from troupe.gpu.timed_runner import StepTime, TimedRunner
from troupe.ops.bench_serve import engine_config
from troupe.ops.serve_client import EngineClient
from troupe.ops.serve_load import run_load
from troupe.ops.serve_workload import LengthSpec, make_requests


def summarize(steps: Sequence[StepTime], t0: float, show: int) -> list[str]:
    """The report's step lines (module docstring) for the steps of one burst started at t0."""
    if not steps:
        return ["no steps"]
    first = steps[0]
    lines = [
        f"first step: +{1e3 * (first.start - t0):.1f} ms, {first.num_seqs} sequences, "
        f"{first.num_tokens} tokens"
    ]
    last_prefill = max((i for i, s in enumerate(steps) if s.num_prefill_seqs), default=-1)
    if last_prefill >= 0:
        phase = steps[: last_prefill + 1]
        span = phase[-1].end - phase[0].start
        prefill = sum(s.num_tokens - (s.num_seqs - s.num_prefill_seqs) for s in phase)
        decodes = sum(s.num_seqs - s.num_prefill_seqs for s in phase)
        lines.append(
            f"prefill: {len(phase)} steps, {1e3 * span:.1f} ms, {prefill} prompt tokens "
            f"({prefill / span / 1e3 if span > 0 else 0.0:.1f}K/s), {decodes} decodes carried"
        )
    tail = steps[last_prefill + 1 :]
    if len(tail) > 1:
        periods = [1e3 * (b.start - a.start) for a, b in itertools.pairwise(tail)]
        lines.append(
            f"decode: {len(tail)} steps, median period {statistics.median(periods):.2f} ms, "
            f"median {statistics.median(s.num_seqs for s in tail):.0f} sequences"
        )
    prev_end = t0
    for s in steps[:show]:
        start, end, gap = 1e3 * (s.start - t0), 1e3 * (s.end - t0), 1e3 * (s.start - prev_end)
        lines.append(
            f"  step {s.step_id}: +{start:7.1f} .. +{end:7.1f} ms (gap {gap:5.1f}) "
            f"seqs {s.num_seqs:4d} prefill {s.num_prefill_seqs:3d} tokens {s.num_tokens:6d}"
        )
        prev_end = s.end
    return lines


BUCKETS = ((16, "1-16"), (64, "17-64"), (128, "65-128"), (256, "129-256"), (1 << 30, ">256"))


def by_batch(steps: Sequence[StepTime]) -> list[str]:
    """Steps grouped by sequences (prefill steps apart): how many, the median time inside the
    runner (on CUDA with overlap: its host work plus any wait for the GPU) and the median and
    total gap since the previous step ended (the actors' planning, during which the GPU runs
    only what was launched ahead)."""
    gaps = [0.0] + [1e3 * (b.start - a.end) for a, b in itertools.pairwise(steps)]
    groups: dict[str, list[tuple[float, float]]] = {}
    for step, gap in zip(steps, gaps, strict=True):
        size = next(label for top, label in BUCKETS if step.num_seqs <= top)
        name = "prefill" if step.num_prefill_seqs else f"{size} seqs"
        groups.setdefault(name, []).append((1e3 * (step.end - step.start), gap))
    return [
        f"  {name}: {len(rows)} steps, in the runner median {statistics.median(r[0] for r in rows):.2f} ms, "
        f"gap median {statistics.median(r[1] for r in rows):.2f} ms, total {sum(r[1] for r in rows):.0f} ms"
        for name, rows in groups.items()
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m troupe.ops.burst_steps", description=__doc__)
    p.add_argument("--bursts", type=int, default=2)
    p.add_argument("--num-prompts", type=int, default=300)
    p.add_argument("--min-input-len", type=int, default=128)
    p.add_argument("--max-input-len", type=int, default=1024)
    p.add_argument("--min-output-len", type=int, default=64)
    p.add_argument("--max-output-len", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--seed", type=int, default=1001, help="the first burst's; +1 each burst")
    p.add_argument("--steps", type=int, default=30, help="steps listed per burst")
    return p


async def run(args: argparse.Namespace, engine_args: list[str]) -> list[str]:
    """Open the engine, one warm-up request, then the bursts; the report's lines."""
    from troupe.actors.engine import Engine
    from troupe.gpu.runner import build_runner

    config = engine_config(engine_args)
    if config.runner == "model":  # the step budget the engine resolves for its own runner
        from troupe.gpu.runner_setup import with_step_budget

        config = with_step_budget(config)
    spec = LengthSpec(
        min_input_len=args.min_input_len,
        max_input_len=args.max_input_len,
        min_output_len=args.min_output_len,
        max_output_len=args.max_output_len,
    )
    runner = TimedRunner(build_runner(config))
    out: list[str] = []
    async with Engine.open(config, runner=runner) as engine:
        client = EngineClient(engine, temperature=args.temperature, ignore_eos=True)
        await client.send(make_requests(spec, 1, seed=args.seed - 1)[0])
        for burst in range(args.bursts):
            requests = make_requests(spec, args.num_prompts, seed=args.seed + burst)
            mark, t0 = len(runner.steps), time.perf_counter()
            results, duration = await run_load(client, requests)
            ttft = sorted(1e3 * r.ttft for r in results if r.success)
            tokens = sum(r.output_tokens for r in results)
            out.append(
                f"burst {burst + 1}: TTFT min {ttft[0]:.0f} p50 {statistics.median(ttft):.0f} "
                f"max {ttft[-1]:.0f} ms; {duration:.2f} s, {tokens / duration:.0f} output tok/s"
            )
            out.extend(summarize(runner.steps[mark:], t0, args.steps))
    return out


def main(argv: list[str] | None = None) -> int:
    args, engine_args = build_parser().parse_known_args(argv)
    for line in asyncio.run(run(args, engine_args)):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
