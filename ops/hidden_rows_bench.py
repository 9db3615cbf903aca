"""What reading final hidden states costs a prompt: prompt logprobs and embeddings against a
plain one-token request, in one engine.

    python -m troupe.ops.hidden_rows_bench                 # the default model on the CPU
    python -m troupe.ops.hidden_rows_bench --model PATH --device cuda --prompt-len 4096

Each kind runs `--repeats` times, alternating, on fresh prompts of `--prompt-len` random ids
(no prefix-cache hit between them: each differs in its first token); prints the median time to
the request's end (one token) per kind and its ratio to plain. A scored prompt computes the
lm_head on every position (256 rows at a time, gpu/prompt_logprobs.py) and runs eagerly; a
pooled one only reads rows (gpu/hidden_rows.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

KINDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "prompt_logprobs=1": {"prompt_logprobs": 1},
    "prompt_logprobs=20": {"prompt_logprobs": 20},
    "pooling last": {"pooling": {"type": "last"}},
    "pooling mean": {"pooling": {"type": "mean"}},
}


def measure(config: Any, prompt_len: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per request, per kind (warm: one plain request first)."""
    import anyio
    import msgspec
    from troupe import Engine, SamplingParams
    from troupe.messages import Delta, Finished

    times: dict[str, list[float]] = {kind: [] for kind in KINDS}

    async def main() -> None:
        async with Engine.open(config) as engine:
            vocab = engine.tokenizer.vocab_size
            serial = 0

            async def one(extra: dict[str, Any]) -> float:
                nonlocal serial
                serial += 1
                prompt = [
                    (serial * 7919 + i * 104729) % (vocab - 10) + 5 for i in range(prompt_len)
                ]
                params = msgspec.convert({"max_tokens": 1, **extra}, SamplingParams)
                t = time.perf_counter()
                events = [e async for e in engine.generate(prompt, params)]
                took = time.perf_counter() - t
                first, last = events[0], events[-1]
                if not isinstance(last, Finished) or not isinstance(first, Delta | Finished):
                    raise RuntimeError(f"{extra}: the request did not finish: {last}")
                scored = first.prompt_logprobs is not None and len(first.prompt_logprobs)
                if "prompt_logprobs" in extra and scored != prompt_len - 1:
                    raise RuntimeError(f"{extra}: {scored} prompt logprobs for {prompt_len} tokens")
                if "pooling" in extra and first.embedding is None:
                    raise RuntimeError(f"{extra}: no embedding")
                return took

            await one({})
            for _ in range(repeats):
                for kind, extra in KINDS.items():
                    times[kind].append(await one(extra))

    anyio.run(main)
    return times


def report(times: dict[str, list[float]]) -> list[str]:
    plain = statistics.median(times["plain"])
    return [
        f"{kind:20s} {1e3 * statistics.median(t):8.1f} ms  {statistics.median(t) / plain:5.2f}x plain"
        for kind, t in times.items()
    ]


def main(argv: list[str] | None = None) -> int:
    from troupe import EngineConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    config = EngineConfig(model=args.model, device=args.device)
    for line in report(measure(config, args.prompt_len, args.repeats)):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
