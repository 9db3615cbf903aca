"""Structured-output overhead: step time with a JSON schema per request vs without.

Qwen3-0.6B shape, random bf16 weights, a synthetic byte-level vocabulary of the model's full
size (151,936 tokens: bytes, then random fragments of letters, digits, spaces and JSON
punctuation; xgrammar's mask cost grows with the vocabulary), N concurrent requests with
random prompt ids, each with its own schema (ops/json_schemas.py). Run A constrains every
request and records how many tokens each produced; run B runs the same prompts unconstrained
with exactly those lengths (ignore_eos), so both runs take the same steps over the same
batches. Every schema is compiled before the clock starts (`--cold` leaves that to run A);
an untimed run A warms the masked path up first, and the repeats alternate A/B and B/A.
Prints ms/step for both runs and their ratio (target <= 1.15), and the grammar actor's time.

    python -m troupe.ops.bench_structured                 # the H200 run
    python -m troupe.ops.bench_structured --smoke         # a tiny model on the CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from troupe.config import EngineConfig
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.weights import qwen3_0_6b_config
from troupe.ops.bench_offline import write_model_weights
from troupe.ops.engine_client import CLIENTS, run_requests
from troupe.ops.json_schemas import make_schemas

_ALPHABET = "abcdefghijklmnopqrstuvwxyz" * 4 + "ABCDEFGHIJ0123456789" + ' {}[]":,.-_'


def synthetic_vocab(size: int, special_ids: tuple[int, ...], seed: int = 0) -> list[str]:
    """`size` distinct byte-level (GPT-2 alphabet) token strings; `special_ids` get names."""
    from troupe.actors.core.tokenizer_text import byte_level_alphabet

    to_char = {b: c for c, b in byte_level_alphabet().items()}
    rng = random.Random(seed)
    seen: set[str] = set()
    vocab: list[str] = []
    for b in range(256):
        vocab.append(to_char[b])
        seen.add(vocab[-1])
    while len(vocab) < size:
        text = ("Ġ" if rng.random() < 0.4 else "") + "".join(
            rng.choice(_ALPHABET) for _ in range(rng.randint(1, 7))
        )
        token = "".join(to_char[b] for b in text.replace("Ġ", " ").encode())
        if token not in seen:
            seen.add(token)
            vocab.append(token)
    for i in special_ids:
        vocab[i] = f"<|special{i}|>"
    return vocab


def write_model_folder(folder: Path, config: ModelConfig) -> None:
    """config.json, random bf16 weights and a byte-level tokenizer.json of the full vocab."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    c = config
    write_model_weights(folder, c)
    vocab = synthetic_vocab(c.vocab_size, c.eos_token_ids)
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token=vocab[0]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(vocab[i], special=True) for i in c.eos_token_ids])
    tok.save(str(folder / "tokenizer.json"))


def run(folder: Path, args: argparse.Namespace, vocab_size: int) -> dict[str, Any]:
    import anyio
    from troupe import Engine, SamplingParams
    from troupe.messages import StructuredOutputs

    rng = random.Random(0)
    prompts = [
        [rng.randrange(300, vocab_size - 300) for _ in range(args.prompt_len)]
        for _ in range(args.num_seqs)
    ]
    specs = [StructuredOutputs.from_schema(s) for s in make_schemas(args.num_seqs)]
    config = EngineConfig(
        model=str(folder),
        max_num_seqs=args.num_seqs,
        max_model_len=args.prompt_len + args.max_tokens + 16,
        enforce_eager=args.enforce_eager,
        grammar_threads=args.grammar_threads,
        grammar_worker=args.grammar_worker,
        gil_switch_interval_s=args.gil_switch_interval,
        draw_masked_ahead=args.draw_masked_ahead,
    )
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Engine.open(config) as engine:
            snapshots: list[tuple[float, int, int]] = []  # (time, steps so far, running)
            engine.add_stats_listener(
                lambda s: snapshots.append((time.perf_counter(), s.num_steps, s.num_running))
            )

            async def timed(
                params: list[SamplingParams],
            ) -> tuple[list[int], float, int, float, float]:
                steps0, busy0 = (
                    engine.stats().num_steps,
                    engine.actor_busy_seconds().get("grammar", 0.0),
                )

                before, busy_before = engine.runner_stats(), engine.actor_busy_seconds()

                snapshots.clear()
                start = time.perf_counter()
                counts = await run_requests(engine, prompts, params, args.client)
                elapsed = time.perf_counter() - start
                steady = steady_step_ms(snapshots, max(len(params) // 2, 1))
                steps = engine.stats().num_steps - steps0
                grammar = engine.actor_busy_seconds().get("grammar", 0.0) - busy0
                after = engine.runner_stats()
                print(
                    f"  {steps} steps: overlapped {after.num_overlapped - before.num_overlapped},"
                    f" hits {after.num_overlap_hits - before.num_overlap_hits}; actor busy "
                    + ", ".join(
                        f"{k}={v - busy_before.get(k, 0.0):.2f}s"
                        for k, v in sorted(engine.actor_busy_seconds().items())
                    )
                )
                return counts, elapsed, steps, grammar, steady

            start = time.perf_counter()
            first = SamplingParams(max_tokens=4, structured_outputs=specs[0])
            await run_requests(engine, [[1, 2, 3]], [first])
            out["first_compile_s"] = time.perf_counter() - start  # includes the vocab's info
            if not args.cold:
                start = time.perf_counter()
                each = [SamplingParams(max_tokens=1, structured_outputs=s) for s in specs]
                await run_requests(engine, [[1, 2, 3]] * len(specs), each)
                out["compile_all_s"] = time.perf_counter() - start
            constrained = [
                SamplingParams(
                    max_tokens=args.max_tokens, temperature=0.6, seed=i, structured_outputs=s
                )
                for i, s in enumerate(specs)
            ]
            # an untimed structured run first: it warms the masked path up and gives each
            # request's length, which the free run then generates without a grammar
            counts, *_ = await timed(constrained)
            free = [
                SamplingParams(max_tokens=max(n, 1), temperature=0.6, seed=i, ignore_eos=True)
                for i, n in enumerate(counts)
            ]
            runs: list[tuple[float, float]] = []  # (structured, free) ms/step per repeat
            steady: list[tuple[float, float]] = []  # the same, steady steps (steady_step_ms)
            grammar_s = 0.0
            for repeat in range(args.repeats):  # the same steps each time: seeded sampling
                # the order alternates: a drift over the run (GC, clocks) falls on both alike
                if repeat % 2:
                    _, t_b, steps_b, _, steady_b = await timed(free)
                counts, t_a, steps_a, grammar_a, steady_a = await timed(constrained)
                if not repeat % 2:
                    _, t_b, steps_b, _, steady_b = await timed(free)
                runs.append((1000 * t_a / max(steps_a, 1), 1000 * t_b / max(steps_b, 1)))
                steady.append((steady_a, steady_b))
                grammar_s += grammar_a / max(steps_a, 1)
            out.update(
                steady=steady,
                tokens=sum(counts),
                num_length=sum(n >= args.max_tokens for n in counts),
                steps=steps_a,
                runs=runs,
                grammar_ms=1000 * grammar_s / args.repeats,
            )

    anyio.run(main)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--repeats", type=int, default=5, help="pairs of runs; medians")
    parser.add_argument("--grammar-threads", type=int, default=EngineConfig.grammar_threads)
    parser.add_argument(
        "--gil-switch-interval", type=float, default=EngineConfig.gil_switch_interval_s,
        help="seconds; 0 leaves the interpreter's own (5 ms)",
    )  # fmt: skip
    parser.add_argument(
        "--grammar-worker", choices=("auto", "thread", "process"),
        default=EngineConfig.grammar_worker,
    )  # fmt: skip
    parser.add_argument(
        "--draw-masked-ahead", action=argparse.BooleanOptionalAction,
        default=EngineConfig.draw_masked_ahead,
    )  # fmt: skip
    parser.add_argument(
        "--client", choices=CLIENTS, default="tasks",
        help="a task per request (Engine.generate) or callbacks (Engine.submit)",
    )  # fmt: skip
    parser.add_argument("--cold", action="store_true", help="compile the schemas inside run A")
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model: CPU smoke run")
    args = parser.parse_args(argv)
    args.gil_switch_interval = args.gil_switch_interval or None
    config = qwen3_0_6b_config()
    if args.smoke:
        config = dataclasses.replace(
            config, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=4096, eos_token_ids=(4000, 4001),
        )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_model_folder(folder, config)
        r = run(folder, args, config.vocab_size)
    ms_a = statistics.median(a for a, _ in r["runs"])
    ms_b = statistics.median(b for _, b in r["runs"])
    print(f"seqs={args.num_seqs} prompt={args.prompt_len} output tokens={r['tokens']} "
          f"(hit max_tokens: {r['num_length']}); first compile {r['first_compile_s']:.2f}s, "
          f"all schemas {r.get('compile_all_s', float('nan')):.2f}s")  # fmt: skip
    print("per repeat (structured / free ms/step): "
          + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in r["runs"]))  # fmt: skip
    print(f"structured: {ms_a:.2f} ms/step (median of {args.repeats}, {r['steps']} steps each); "
          f"grammar actor busy {r['grammar_ms']:.2f} ms/step")  # fmt: skip
    print(f"free:       {ms_b:.2f} ms/step")
    print(f"step time ratio structured/free: {ms_a / ms_b:.3f} (target <= 1.15); median of the "
          f"repeats' own ratios {statistics.median(a / b for a, b in r['runs']):.3f}")  # fmt: skip
    st_a = statistics.median(a for a, _ in r["steady"])
    st_b = statistics.median(b for _, b in r["steady"])
    print("steady steps (median per run while >= half the requests run; structured / free ms): "
          + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in r["steady"])
          + f"; ratio of medians {st_a / st_b:.3f}")  # fmt: skip
    return 0


def steady_step_ms(snapshots: list[tuple[float, int, int]], min_running: int) -> float:
    """Median ms per step between the engine's stats snapshots (time, steps so far, running)
    while at least `min_running` requests ran: the run's full-batch steps, without its prefill
    and its tail of a few requests, and robust to a stray slow step (NaN if none)."""
    per_step = [
        1000 * (t1 - t0) / (s1 - s0)
        for (t0, s0, running), (t1, s1, _) in itertools.pairwise(snapshots)
        if s1 > s0 and running >= min_running
    ]
    return statistics.median(per_step) if per_step else math.nan


if __name__ == "__main__":
    raise SystemExit(main())
