"""The garbage collector's pauses with an engine running, gc_freeze off and on.

    python -m troupe.ops.gc_pause_bench            # the default model (SmolLM2) on the CPU
    python -m troupe.ops.gc_pause_bench --model PATH --device cuda --requests 256

For each setting, in one process (off first): open the engine, serve one warm-up request, then
`--requests` requests of `--max-tokens` tokens at once while gc.callbacks time every
collection (full ones apart), then time one gc.collect() by hand with the engine still open.
Prints the tracked objects at ready, the frozen count, the collections and their longest pause.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any


def measure(config: Any, requests: int, max_tokens: int) -> dict[str, float]:
    import anyio
    from troupe import Engine, SamplingParams

    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started[0])

    out: dict[str, float] = {}

    async def main() -> None:
        rng = random.Random(0)
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0, ignore_eos=True)
        async with Engine.open(config) as engine:
            async for _ in engine.generate([1, 2, 3], params):
                pass
            out["tracked"] = len(gc.get_objects())
            out["frozen"] = gc.get_freeze_count()

            async def one() -> None:
                async for _ in engine.generate([rng.randint(5, 1000) for _ in range(64)], params):
                    pass

            gc.callbacks.append(on_gc)
            t = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(requests):
                    tg.start_soon(one)
            out["seconds"] = time.perf_counter() - t
            gc.callbacks.remove(on_gc)
            t = time.perf_counter()
            gc.collect()
            out["collect_ms"] = 1000 * (time.perf_counter() - t)

    anyio.run(main)
    for gen, times in pauses.items():
        out[f"gen{gen}"] = len(times)
        out[f"gen{gen}_max_ms"] = 1000 * max(times, default=0.0)
        out[f"gen{gen}_total_ms"] = 1000 * sum(times)
    return out


def main(argv: list[str] | None = None) -> int:
    from troupe import EngineConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    for freeze in (False, True):
        config = EngineConfig(model=args.model, device=args.device, gc_freeze=freeze)
        r = measure(config, args.requests, args.max_tokens)
        print(
            f"gc_freeze={freeze!s:<5} tracked at ready {r['tracked']:,.0f}, frozen {r['frozen']:,.0f};"
            f" {args.requests} x {args.max_tokens} tokens in {r['seconds']:.2f} s: collections"
            f" gen0 {r['gen0']:.0f} ({r['gen0_total_ms']:.1f} ms), gen1 {r['gen1']:.0f}"
            f" ({r['gen1_total_ms']:.1f} ms), gen2 {r['gen2']:.0f} (longest"
            f" {r['gen2_max_ms']:.1f} ms); gc.collect() after: {r['collect_ms']:.1f} ms",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
