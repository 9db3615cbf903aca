"""ms per single-stream decode step on the CPU: the one-sequence fast path (gpu/cpu_decode.py)
against the generic forward, in one run, on the same model and tokens.

    python -m troupe.ops.cpu_decode_bench                     # default model, 64 tokens
    python -m troupe.ops.cpu_decode_bench --threads 2 --rounds 5
    python -m troupe.ops.cpu_decode_bench --threads 2 --torch-int4   # torch's int4 kernel

Each round feeds a 16-token prompt, then decodes `--tokens` greedy tokens twice from it: once
through each path, in alternating order round by round (a busy machine slows both alike). Only
the forward is timed (ModelRunner.logits: step inputs, forward, logits; no sampling), as wall
time and as this thread's CPU time (less sensitive to other processes, though torch's own
threads are not counted beyond the first). Prints medians over rounds, and whether both paths
chose the same tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
from troupe.config import EngineConfig
from troupe.gpu.model_runner import ModelRunner
from troupe.ops.quant_agreement import Stream

PROMPT = [1, 504, 3458, 282, 4649, 314, 8, 95, 1200, 33, 17, 4711, 260, 19, 7, 442]


def decode(runner: ModelRunner, name: str, num_tokens: int) -> tuple[list[int], float, float]:
    """Greedy tokens after PROMPT, and wall / thread-CPU seconds per decode step."""
    stream = Stream(runner, name)
    logits = stream.feed(PROMPT)
    tokens: list[int] = []
    wall = cpu = 0.0
    for _ in range(num_tokens):
        tokens.append(int(logits.argmax()))
        w, c = time.perf_counter(), time.thread_time()
        logits = stream.feed(tokens[-1:])
        wall += time.perf_counter() - w
        cpu += time.thread_time() - c
    stream.close()
    return tokens, wall / num_tokens, cpu / num_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a .gguf file or folder (default: the default model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--torch-int4", action="store_true", help="cpu_native_kernels=False: torch's int4 kernel"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # the field is left out unless asked, so the script also runs on commits without it
    extra: dict[str, Any] = {"cpu_native_kernels": False} if args.torch_int4 else {}
    config = EngineConfig(
        device="cpu", model=args.model, num_kv_blocks=64, max_model_len=512, max_num_seqs=1, **extra
    )
    runner = ModelRunner.from_config(config)
    forward = runner._pass  # the benchmark switches the path it times
    fast = forward.cpu_decode
    if fast is None:
        raise SystemExit("the fast path does not apply to this model (gpu/cpu_decode.py)")
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    decode(runner, "warm-up", 8)
    times: dict[str, list[tuple[float, float]]] = {"generic": [], "fast": []}
    outputs: dict[str, list[int]] = {}
    for r in range(args.rounds):
        for name in ("generic", "fast") if r % 2 == 0 else ("fast", "generic"):
            forward.cpu_decode = fast if name == "fast" else None
            tokens, wall, cpu = decode(runner, f"{name}{r}", args.tokens)
            times[name].append((wall, cpu))
            outputs.setdefault(name, tokens)
    forward.cpu_decode = fast
    for name, runs in times.items():
        wall = 1000 * statistics.median(w for w, _ in runs)
        cpu = 1000 * statistics.median(c for _, c in runs)
        print(
            f"{name:8s} {args.tokens} tokens, {args.threads} thread(s): {wall:6.2f} ms/step wall "
            f"({1000 / wall:5.1f} tok/s), {cpu:6.2f} ms/step thread CPU"
        )
    same = outputs["generic"] == outputs["fast"]
    print(f"greedy tokens equal: {same}; load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
