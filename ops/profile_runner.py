"""CPU time of ModelRunner per decode step, split by phase, on a tiny random model.

    python -m troupe.ops.profile_runner                  # 256 seqs, vocab 1024 and 151936
    python -m troupe.ops.profile_runner --vocab 151936 --cprofile
    python -m troupe.ops.profile_runner --model default --num-seqs 8 --threads 2  # SmolLM2

The model is 2 layers of hidden 64, so on the CPU its forward is small and what remains is the
runner's Python (plans to arrays, sampling bookkeeping, tensor creation, output conversion): the
same overhead a GPU step pays before its kernels can run. `--model` (a path, or "default" for
SmolLM2-135M) times a real model on the CPU instead: then the forward is most of the step.
Phases are timed by wrapping the runner's own methods, so the split follows the code:

    prepare   plan -> per-request state -> step arrays (and their copy to the device)
    forward   model.forward + compute_logits
    sample    sampling batch + sampler (fp32 logits -> token ids, logprobs)
    output    the rest of execute: SampledToken construction, bookkeeping
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from troupe.config import EngineConfig
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import build_model, qwen3_tiny_config, random_weights
from troupe.messages import SamplingParams, SeqWork, StepPlan

PHASES = ("prepare", "forward", "sample")


def tiny_runner(vocab_size: int, num_seqs: int, max_model_len: int, num_blocks: int) -> ModelRunner:
    """A 2-layer Qwen3-shaped fp32 model with random weights on the CPU."""
    config = qwen3_tiny_config(vocab_size)
    weights = random_weights(config, torch.float32, seed=0)
    model = build_model(config, weights.items(), torch.float32, torch.device("cpu"), max_model_len)
    block_size = 16
    options = RunnerOptions(
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        num_cpu_blocks=0,
        max_num_seqs=num_seqs,
        max_model_len=max_model_len,
    )
    return ModelRunner(config, model, options)


class Timers:
    """Accumulated seconds per phase while `active` (decode steps only)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.active = False

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.active:
                    self.seconds[name] += time.perf_counter() - start

        return timed


def instrument(runner: ModelRunner, timers: Timers) -> None:
    """Wrap the runner's phase methods on the instance (the class is left alone)."""
    # Instance attributes shadow the methods: the class stays untouched.
    setattr(runner, "_prepare", timers.wrap("prepare", runner._prepare))  # noqa: B010
    setattr(runner.model, "forward", timers.wrap("forward", runner.model.forward))  # noqa: B010
    setattr(  # noqa: B010
        runner.model, "compute_logits", timers.wrap("forward", runner.model.compute_logits)
    )
    setattr(runner, "_sample", timers.wrap("sample", runner._sample))  # noqa: B010


def drive(
    runner: ModelRunner,
    num_seqs: int,
    num_decode: int,
    prompt_len: int,
    timers: Timers,
    before_decode: Callable[[], object] | None = None,
    max_prefill_tokens: int = 16384,
) -> list[float]:
    """Prefill every sequence (whole prompts, at most `max_prefill_tokens` a step, as an
    engine's token budget would), then decode (`before_decode` called between: a profiler's
    start, say); returns seconds per decode step."""
    bs = runner.block_size
    rng = random.Random(0)
    params = SamplingParams(temperature=0.6, max_tokens=num_decode + 1, ignore_eos=True)
    per_seq = -(-(prompt_len + num_decode + 1) // bs)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(num_seqs)]
    prompts = [[rng.randrange(1000) for _ in range(prompt_len)] for _ in range(num_seqs)]
    works = tuple(
        SeqWork(
            request_id=f"r{i}",
            token_ids=tuple(prompts[i]),
            start_pos=0,
            block_ids=tuple(tables[i][: -(-prompt_len // bs)]),
            reset=True,
            params=params,
            num_prompt_tokens=prompt_len,
        )
        for i in range(num_seqs)
    )
    per_step = max(1, max_prefill_tokens // max(1, prompt_len))
    groups = [works[i : i + per_step] for i in range(0, num_seqs, per_step)]
    last = {
        t.request_id: t.token_id
        for step, group in enumerate(groups)
        for t in runner.execute(StepPlan(step_id=step, seqs=group))
    }
    if before_decode is not None:
        before_decode()
    step_seconds = []
    for step in range(1, num_decode + 1):
        pos = prompt_len + step - 1
        new_block = pos % bs == 0
        works = tuple(
            SeqWork(
                request_id=f"r{i}",
                token_ids=(last[f"r{i}"],),
                start_pos=pos,
                block_ids=(tables[i][pos // bs],) if new_block else (),
            )
            for i in range(num_seqs)
        )
        plan = StepPlan(step_id=len(groups) - 1 + step, seqs=works)
        timers.active = True
        start = time.perf_counter()
        out = runner.execute(plan)
        step_seconds.append(time.perf_counter() - start)
        timers.active = False
        last = {t.request_id: t.token_id for t in out}
    return step_seconds


def report(vocab: int | None, args: argparse.Namespace) -> None:
    """Time decode steps of the tiny model with `vocab`, or of args.model when vocab is None."""
    blocks = args.num_seqs * -(-(args.prompt_len + args.num_decode + 1) // 16)
    if vocab is None:
        model = None if args.model == "default" else args.model
        config = EngineConfig(
            device="cpu",
            model=model,
            num_kv_blocks=blocks,
            num_cpu_blocks=0,
            max_num_seqs=args.num_seqs,
            max_model_len=args.max_model_len,
        )
        runner = ModelRunner.from_config(config)
    else:
        runner = tiny_runner(vocab, args.num_seqs, args.max_model_len, blocks)
    timers = Timers()
    profiler = cProfile.Profile() if args.cprofile else None
    drive(runner, args.num_seqs, 3, args.prompt_len, Timers())  # warm-up
    runner.execute(
        StepPlan(step_id=-1, seqs=(), released=tuple(f"r{i}" for i in range(args.num_seqs)))
    )
    instrument(runner, timers)
    if profiler is not None:
        profiler.enable()
    steps = drive(runner, args.num_seqs, args.num_decode, args.prompt_len, timers)
    if profiler is not None:
        profiler.disable()
    n = len(steps)
    total_ms = 1000 * sum(steps) / n
    split = {name: 1000 * timers.seconds[name] / n for name in PHASES}
    split["output"] = total_ms - sum(split.values())
    print(
        f"{args.model or f'vocab={vocab}'} seqs={args.num_seqs} decode steps={n}: "
        f"{total_ms:.2f} ms/step (median {1000 * statistics.median(steps):.2f})"
    )
    print("  " + "  ".join(f"{k}={v:.2f}ms" for k, v in split.items()))
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, action="append", help="default: 1024 and 151936")
    parser.add_argument("--model", help='a real model on the CPU: a path, or "default"')
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--num-decode", type=int, default=50)
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model is not None:
        report(None, args)
        return
    for vocab in args.vocab or [1024, 151936]:
        report(vocab, args)


if __name__ == "__main__":
    main()
