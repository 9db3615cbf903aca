"""ops/hidden_rows_bench.py runs every kind through a real engine graph (the fake runner)."""

from __future__ import annotations

from troupe import EngineConfig
from troupe.ops.hidden_rows_bench import KINDS, measure, report


def test_every_kind_runs_and_is_reported() -> None:
    times = measure(EngineConfig(runner="fake", num_kv_blocks=64, block_size=4), 12, 2)
    assert set(times) == set(KINDS) and all(len(t) == 2 for t in times.values())
    lines = report(times)
    assert len(lines) == len(KINDS) and lines[0].startswith("plain") and "1.00x" in lines[0]
