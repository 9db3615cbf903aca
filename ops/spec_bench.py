"""Speculative decoding (n-gram or a draft model) through the engine: ITL, throughput,
acceptance and the cost of a verification step, with speculation off and on, at several batch
sizes.

Qwen3-0.6B shape, random bf16 weights (ops/bench_offline.write_model_folder), ignore_eos.

- matching: first each prompt p's greedy continuation C (speculation off, not timed), then
  the timed request asks again with the document in its prompt, p + C + p: what prompt lookup
  exists for ("edit this text"). How much the model repeats C there is the model's business:
  the acceptance printed says how honest the match was.
- nonmatching: fresh random prompts (ids < 10,000 drawn uniformly), sampled at temperature
  1 (seeded): a random model's distribution is nearly flat, so its output does not repeat
  either. Greedy, a random model soon loops, and n-gram proposals match the loop.

    python -m troupe.ops.spec_bench                       # H200: batches 1 8 64 256
    python -m troupe.ops.spec_bench --smoke --batches 1 2 # CPU: a 2-layer model
    python -m troupe.ops.spec_bench --tiny --batches 1    # the same model on the H200

A 28-layer random Qwen3 does not copy: its greedy continuation of p + C + p shares no token
with C at the start (HF transformers, 3 prompts, 2-8 layers of width 1,024 too), so the 0.6B
rows measure acceptance of the loops it falls into. The 2-layer model of width 64 (--smoke,
--tiny) does copy (96% acceptance): its rows show what the engine makes of proposals that
match, with a step that is all host work (the case least kind to verification).

Per (workload, batch, mode): output tok/s over the batch's wall time, mean ITL (per request:
time from its first to its last token over the tokens after the first), steps and ms/step
(the cost of a step: a verification computes 1 + k tokens per sequence), acceptance
(accepted / proposed), mean accepted length per verification. The speculative run keeps the
engine's backoff (speculative_disable_by_batch_size: --disable-by-batch-size 0 turns it off;
the cost model of spec_cost.py: --no-cost-model turns it off).

--draft runs speculative_method="draft_model" instead of n-gram (mode "draft"):
  small  a random Qwen3 of the same vocabulary, 4 layers of width 512 (~1/7 of the target's
         weights): unrelated to the target, so it measures what a draft round and its
         rejected verifications cost (acceptance near 0: the backoff's case)
  self   the target drafts for itself: acceptance near 100%, the ceiling of the machinery,
         at the cost of a second target-sized model per step
  PATH   any draft model folder or .gguf of the target's vocabulary (151,936 tokens)
The draft draws with the target's noise (gpu/draft_runner.py). A random model's sampled
distribution is nearly flat, so at temperature 1 both draws are mostly the noise's argmax:
"nonmatching" then shows a high acceptance for any draft, which real models would not.
The greedy "matching" rows are the honest ones for an unrelated draft.

    python -m troupe.ops.spec_bench --draft small      # H200
    python -m troupe.ops.spec_bench --draft self --batches 1 8
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import qwen3_0_6b_config, qwen3_tiny_config
from troupe.ops.bench_offline import write_model_folder


@dataclasses.dataclass
class Row:
    workload: str
    batch: int
    mode: str
    tokens: int
    seconds: float
    itl_ms: float
    steps: int
    proposed: int
    accepted: int
    verifications: int
    overlap_hits: int = 0  # overlapped steps launched before their plan and used / launched
    overlapped: int = 0

    def line(self) -> str:
        rate = self.accepted / self.proposed if self.proposed else 0.0
        mean_len = self.accepted / self.verifications if self.verifications else 0.0
        return (
            f"{self.workload:<11} batch={self.batch:<4} {self.mode:<5} "
            f"tok/s={self.tokens / self.seconds:>9,.0f}  ITL={self.itl_ms:7.2f} ms  "
            f"steps={self.steps:<5} ms/step={1000 * self.seconds / max(self.steps, 1):6.2f}  "
            f"acceptance={rate:5.1%} ({self.accepted}/{self.proposed})  "
            f"accepted len={mean_len:4.2f} over {self.verifications} verifications  "
            f"overlap={self.overlap_hits}/{self.overlapped}"
        )


def run_batches(
    config: Any, mode: str, workloads: dict[str, list[list[int]]], args: argparse.Namespace
) -> tuple[list[Row], list[list[int]]]:
    """Each workload at each batch size through one engine; the outputs of `generate` first
    (not timed) when args.generate is set."""
    import anyio
    from troupe import Engine, SamplingParams

    rows: list[Row] = []
    generated: list[list[int]] = []
    greedy = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)

    async def main() -> None:
        async with Engine.open(config) as engine:

            async def one(prompt: list[int], out: list[Any], params: Any) -> None:
                tokens: list[int] = []
                times: list[float] = []
                async for event in engine.generate(prompt, params):
                    if event.token_ids:
                        tokens.extend(event.token_ids)
                        times.append(time.perf_counter())
                out.append((tokens, times))

            async def batch(prompts: list[list[int]], sampled: bool = False) -> list[Any]:
                outs: list[Any] = [[] for _ in prompts]
                async with anyio.create_task_group() as tg:
                    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
                        params = greedy
                        if sampled:
                            params = msgspec.structs.replace(greedy, temperature=1.0, seed=i)
                        tg.start_soon(one, prompt, out, params)
                return [o[0] for o in outs]

            # warm-up: compile before the clock starts (a repeating prompt: one verification)
            await batch([[1, 2, 3, 1, 2, 3] if args.warmup == "repeat" else [1, 2, 3, 4, 5, 6]])
            if "generate" in workloads:
                generated.extend(t for t, _ in await batch(workloads["generate"]))
            for name, prompts in workloads.items():
                if name == "generate":
                    continue
                for size in [args.row_batch] if args.row_batch else args.batches:
                    # the run of median time among --repeats (a single run swings 20-30% on a
                    # busy host)
                    runs = []
                    for _ in range(args.repeats):
                        before = engine.stats()
                        r0 = engine.runner_stats()
                        start = time.perf_counter()
                        results = await batch(prompts[:size], sampled=name == "nonmatching")
                        seconds = time.perf_counter() - start
                        r1 = engine.runner_stats()
                        hits = r1.num_overlap_hits - r0.num_overlap_hits
                        launched = r1.num_overlapped - r0.num_overlapped
                        runs.append((seconds, before, engine.stats(), results, hits, launched))
                    runs.sort(key=lambda run: run[0])
                    seconds, before, after, results, hits, launched = runs[len(runs) // 2]
                    itls = [
                        (times[-1] - times[0]) / (len(tokens) - len(first))
                        for tokens, times, first in (
                            (t, ts, _first_delta(t, ts)) for t, ts in results
                        )
                        if len(tokens) > len(first)
                    ]
                    lengths = after.spec_accepted_lengths
                    old = before.spec_accepted_lengths or (0,) * len(lengths)
                    rows.append(
                        Row(
                            workload=name,
                            batch=size,
                            mode=mode,
                            tokens=sum(len(t) for t, _ in results),
                            seconds=seconds,
                            itl_ms=1000 * sum(itls) / max(len(itls), 1),
                            steps=after.num_steps - before.num_steps,
                            proposed=after.num_spec_proposed_tokens
                            - before.num_spec_proposed_tokens,
                            accepted=after.num_spec_accepted_tokens
                            - before.num_spec_accepted_tokens,
                            verifications=sum(lengths) - sum(old),
                            overlap_hits=hits,
                            overlapped=launched,
                        )
                    )
                    print(rows[-1].line(), flush=True)

    anyio.run(main)
    return rows, generated


def _first_delta(tokens: list[int], times: list[float]) -> list[int]:
    """The first delta's tokens (one, the prefill's): ITL counts the tokens after it."""
    return tokens[:1]


def draft_shape(model: ModelConfig) -> ModelConfig:
    """A smaller Qwen3 of `model`'s vocabulary: 4 layers (1 for a tiny model), half as wide."""
    heads = max(model.num_heads // 2, 1)
    return dataclasses.replace(
        model,
        hidden_size=model.hidden_size // 2,
        num_layers=4 if model.num_layers > 4 else 1,
        num_heads=heads,
        num_kv_heads=max(model.num_kv_heads // 2, 1),
        head_dim=model.head_dim // 2,
        intermediate_size=model.intermediate_size // 2,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per row in one engine; the median's kept"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="each mode in child processes, alternating, this many rounds (ops/spec_isolated.py)",
    )
    parser.add_argument(
        "--isolate-rows",
        action="store_true",
        help="with --rounds: each (workload, batch) in an engine of its own, not after others",
    )
    parser.add_argument(
        "--workload", choices=("matching", "nonmatching"), help="only this workload's rows"
    )
    parser.add_argument(
        "--warmup",
        choices=("repeat", "plain"),
        default="repeat",
        help="the untimed first request: one that speculation verifies, or one it cannot",
    )
    parser.add_argument(
        "--row-batch",
        type=int,
        help="only this one of --batches (prompts and pool still sized by all of them)",
    )
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument(
        "--disable-by-batch-size", type=int, default=32, help="0: speculate at any batch size"
    )
    parser.add_argument(
        "--no-cost-model",
        action="store_true",
        help="speculative_cost_model=False: propose in every step the batch limit allows",
    )
    parser.add_argument("--draft", help="small | self | PATH: draft-model speculation (above)")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model: CPU smoke run")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="the smoke run's 2-layer model on the default device (a random model that copies)",
    )
    return parser.parse_args(argv)


def bench_model(args: argparse.Namespace) -> ModelConfig:
    """Qwen3-0.6B's shape, or (--smoke, --tiny) the 2-layer model of width 64 that copies."""
    return qwen3_tiny_config() if args.smoke or args.tiny else qwen3_0_6b_config()


def bench_prompts(args: argparse.Namespace) -> tuple[list[list[int]], list[list[int]]]:
    """The base prompts (their continuations make the matching workload) and the nonmatching."""
    rng = random.Random(0)
    num = max(args.batches)

    def prompts() -> list[list[int]]:
        return [[rng.randint(0, 10_000) for _ in range(args.prompt_len)] for _ in range(num)]

    return prompts(), prompts()


def bench_configs(args: argparse.Namespace, folder: Path) -> tuple[Any, Any, str]:
    """(speculation off, on, the on mode's name) for the model written in `folder`."""
    from troupe import EngineConfig

    num = max(args.batches)
    common: dict[str, Any] = {
        "model": str(folder / "model"),
        "max_num_seqs": max(256, num),
        "max_model_len": 3 * args.prompt_len + 2 * args.output_len + 64,
        "enforce_eager": args.enforce_eager,
    }
    # a pool sized to the workload: each engine's pool is freed only when the next starts
    common["num_kv_blocks"] = num * -(-common["max_model_len"] // 16) + 64
    if args.smoke:
        common.update(device="cpu", num_kv_blocks=max(64, num * 40))
    method: dict[str, Any] = {
        "speculative_method": "ngram",
        "prompt_lookup_min": args.prompt_lookup_min,
        "prompt_lookup_max": args.prompt_lookup_max,
    }
    if args.draft:
        method = {"speculative_method": "draft_model", "draft_model": args.draft}
        if args.draft == "self":
            method["draft_model"] = str(folder / "model")
        elif args.draft == "small":
            method["draft_model"] = str(folder / "draft")
    on = EngineConfig(
        **common,
        **method,
        num_speculative_tokens=args.k,
        speculative_disable_by_batch_size=args.disable_by_batch_size or None,
        speculative_cost_model=not args.no_cost_model,
    )
    return EngineConfig(**common), on, "draft" if args.draft else "ngram"


def write_models(args: argparse.Namespace, folder: Path) -> None:
    """The random target (and --draft small's draft) under `folder`."""
    model = bench_model(args)
    (folder / "model").mkdir()
    write_model_folder(folder / "model", model)
    if args.draft == "small":
        (folder / "draft").mkdir()
        write_model_folder(folder / "draft", draft_shape(model))


def print_speedups(rows: list[Row], mode: str) -> None:
    """Each speculative row against the same workload and batch with speculation off."""
    print(f"\nspeedup ({mode} vs off): ITL ratio off/on, throughput ratio on/off")
    by_key = {(r.workload, r.batch, r.mode): r for r in rows}
    for r in rows:
        if r.mode != mode:
            continue
        base_row = by_key[(r.workload, r.batch, "off")]
        print(
            f"{r.workload:<11} batch={r.batch:<4} ITL {base_row.itl_ms / max(r.itl_ms, 1e-9):5.2f}x"
            f"  throughput {r.tokens / r.seconds / (base_row.tokens / base_row.seconds):5.2f}x"
            f"  step cost {1000 * r.seconds / max(r.steps, 1):.2f} ms vs "
            f"{1000 * base_row.seconds / max(base_row.steps, 1):.2f} ms"
        )


def pick(args: argparse.Namespace, workloads: dict[str, Any]) -> dict[str, Any]:
    """The workloads that --workload keeps ("generate" always: the matching one needs it)."""
    return {k: v for k, v in workloads.items() if args.workload in (None, k) or k == "generate"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rounds:
        from troupe.ops.spec_isolated import run_isolated

        return run_isolated(args, argv)
    base, nonmatching = bench_prompts(args)
    with tempfile.TemporaryDirectory() as tmp:
        write_models(args, Path(tmp))
        off, on, mode = bench_configs(args, Path(tmp))
        first = pick(args, {"generate": base, "nonmatching": nonmatching})
        rows, docs = run_batches(off, "off", first, args)
        matching = [p + c + p for p, c in zip(base, docs, strict=True)]
        more, _ = run_batches(off, "off", pick(args, {"matching": matching}), args)
        both = pick(args, {"matching": matching, "nonmatching": nonmatching})
        spec, _ = run_batches(on, mode, both, args)
    print_speedups([*rows, *more, *spec], mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
