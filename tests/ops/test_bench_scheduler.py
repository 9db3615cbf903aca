"""`troupe bench scheduler`'s measurement: it keeps no messages (their upkeep is the harness's,
not the scheduler's) and still finds every full decode step."""

from __future__ import annotations

from typing import Any

import pytest
from troupe.ops import bench_scheduler


def test_measure_counts_decode_steps_and_keeps_no_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loops: list[bench_scheduler.CoreLoop] = []
    build = bench_scheduler.build_loop

    def keep_loop(**kwargs: Any) -> bench_scheduler.CoreLoop:
        loops.append(build(**kwargs))
        return loops[-1]

    monkeypatch.setattr(bench_scheduler, "build_loop", keep_loop)
    row = bench_scheduler.measure(num_seqs=8, prompt_len=40, num_decode=12)
    # 12 tokens each: the first comes with the prefill, then 11 steps decode all 8 together
    assert row["num_seqs"] == 8 and row["decode_steps"] == 11 and row["median_ms"] > 0
    (loop,) = loops
    assert loop.plans == [] and loop.batches == []
    assert len(loop.plan_sizes) == loop.num_plans == len(loop.scheduler_s) > 11
    assert all(len(tokens) == 12 for tokens in loop.tokens.values()) and len(loop.tokens) == 8
