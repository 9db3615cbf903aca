"""What a thinking budget costs the executor's step on the host: build_logit_edits over a batch
of budgeted rows (gpu/logit_edits.py), each row's output read in full at every step (no scan),
or only past the scan it keeps between steps (gpu/thinking_budget.ThinkingScan).

    python -m troupe.ops.thinking_budget_bench [--rows 256] [--lengths 1000 8000 32000]

Each row's output is random tokens with its thinking opened near the start and closed halfway,
so every step reads to the end and forces nothing (the common case, a long answer after its
thinking). For each length: the output grows a token a step for --steps steps, the first one
(the scan reading everything once) left out; prints the median ms per step both ways.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from troupe.gpu.logit_edits import build_logit_edits, request_edits
from troupe.messages import SamplingParams, ThinkingIds

OPEN, CLOSE = (151667,), (151668,)  # Qwen3's <think>, </think>


def step_ms(rows: int, length: int, steps: int, keep_scan: bool, seed: int = 0) -> float:
    """Median ms of build_logit_edits over `rows` budgeted rows whose outputs start at
    `length` tokens and grow one a step."""
    rng = np.random.default_rng(seed)
    ids = ThinkingIds(start=OPEN, end=CLOSE, opened=False)
    params = SamplingParams(thinking_token_budget=512, thinking_tags=("a", "b"), thinking_ids=ids)
    edits = [request_edits(params, ()) for _ in range(rows)]
    total = length + steps + 1
    histories = [rng.integers(10, 150_000, total).astype(np.int64) for _ in range(rows)]
    for history in histories:
        history[3], history[length // 2] = OPEN[0], CLOSE[0]
    device = torch.device("cpu")
    times = []
    for step in range(steps + 1):
        num = np.full(rows, length + step, np.int64)
        start = time.perf_counter()
        built = build_logit_edits(edits, num, device, histories, num, num if keep_scan else None)
        times.append(time.perf_counter() - start)
        assert built is None  # nothing forced: past the thinking
    return 1000 * statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 8000, 32000])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    print(f"{args.rows} budgeted rows, median ms per step's build_logit_edits")
    for length in args.lengths:
        full = step_ms(args.rows, length, args.steps, keep_scan=False)
        kept = step_ms(args.rows, length, args.steps, keep_scan=True)
        print(f"output {length:>6}: read in full {full:8.2f} ms   scan kept {kept:6.2f} ms")


if __name__ == "__main__":
    main()
