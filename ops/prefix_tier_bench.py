"""The prefix cache's CPU tier on a multi-turn chat whose shared prefixes overflow the GPU cache:
TTFT and prompt tokens computed, with the tier and without, in one run.

Each of `--users` users has its own history of `--prefix-len` tokens; every turn resends it with
one more question of `--question-len` tokens and asks for `--output-len` tokens (ignore_eos).
Turns go round the users `--concurrency` at a time, so while one user waits for its next turn
the others' prompts push its cached blocks out of a GPU pool sized to `--gpu-fraction` of all
histories. Without the tier those blocks are recomputed; with it they come back from the CPU
pool (sized to hold every history).

    python -m troupe.ops.prefix_tier_bench            # H200: Qwen3-0.6B shape, random bf16
    python -m troupe.ops.prefix_tier_bench --smoke    # CPU: a 2-layer model, small sizes
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from troupe.gpu.weights import qwen3_0_6b_config, qwen3_tiny_config
from troupe.ops.bench_offline import write_model_folder

BLOCK = 16


def run(config: Any, histories: list[list[int]], args: argparse.Namespace) -> dict[str, float]:
    """Every turn after the first of every user; TTFT p50/p90 (ms) and the counters' deltas."""
    import anyio
    from troupe import Engine, SamplingParams

    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    rng = random.Random(1)
    ttfts: list[float] = []

    async def main() -> dict[str, float]:
        async with Engine.open(config) as engine:
            limit = anyio.Semaphore(args.concurrency)

            async def turn(user: int, measured: bool) -> None:
                async with limit:
                    histories[user] += [rng.randint(0, 10_000) for _ in range(args.question_len)]
                    start = time.perf_counter()
                    first = None
                    async for event in engine.generate(list(histories[user]), params):
                        if event.token_ids and first is None:
                            first = time.perf_counter() - start
                    if measured and first is not None:
                        ttfts.append(first)

            before = engine.stats()
            for t in range(args.turns):
                if t == 1:
                    before = engine.stats()
                async with anyio.create_task_group() as tg:
                    for user in range(len(histories)):
                        tg.start_soon(turn, user, t > 0)
            after = engine.stats()
        query = after.prefix_cache_query_tokens - before.prefix_cache_query_tokens
        hits = after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens
        cpu = after.prefix_cache_cpu_hit_tokens - before.prefix_cache_cpu_hit_tokens
        q = statistics.quantiles(ttfts, n=10)
        return {"ttft_p50": 1000 * statistics.median(ttfts), "ttft_p90": 1000 * q[-1],
                "computed": query - hits, "hits": hits, "cpu_hits": cpu}  # fmt: skip

    return anyio.run(main)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--prefix-len", type=int, default=2048)
    parser.add_argument("--question-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--gpu-fraction", type=float, default=0.4)
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model on the CPU")
    args = parser.parse_args(argv)
    from troupe import EngineConfig

    model = qwen3_tiny_config() if args.smoke else qwen3_0_6b_config()
    total_len = args.prefix_len + args.turns * (args.question_len + args.output_len) + 64
    history_blocks = args.users * -(-total_len // BLOCK)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        folder.mkdir()
        write_model_folder(folder, model)
        results = {}
        for tier in (False, True):
            config = EngineConfig(
                model=str(folder), device="cpu" if args.smoke else "cuda", block_size=BLOCK,
                max_model_len=total_len, max_num_seqs=args.concurrency,
                num_kv_blocks=max(int(args.gpu_fraction * history_blocks),
                                  args.concurrency * -(-total_len // BLOCK)),
                num_cpu_blocks=history_blocks + 64, prefix_cache_cpu_tier=tier,
            )  # fmt: skip
            rng = random.Random(0)  # the same histories for both runs
            histories = [
                [rng.randint(0, 10_000) for _ in range(args.prefix_len)] for _ in range(args.users)
            ]
            results[tier] = r = run(config, histories, args)
            print(
                f"cpu tier {'on ' if tier else 'off'}: TTFT p50 {r['ttft_p50']:8.1f} ms  "
                f"p90 {r['ttft_p90']:8.1f} ms  prompt tokens computed {r['computed']:>9,}  "
                f"hits {r['hits']:>9,} (CPU tier {r['cpu_hits']:,})",
                flush=True,
            )
    off, on = results[False], results[True]
    print(
        f"users={args.users} prefix={args.prefix_len} turns={args.turns} "
        f"concurrency={args.concurrency}: TTFT p50 {off['ttft_p50'] / on['ttft_p50']:.2f}x "
        f"lower with the tier, {off['computed'] / max(on['computed'], 1):.2f}x fewer tokens "
        "computed"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
