"""ops/gc_pause_bench.py measures through a real engine graph (the fake runner here)."""

from __future__ import annotations

from troupe import EngineConfig
from troupe.ops.gc_pause_bench import measure


def test_measure_reports_the_frozen_heap_only_when_asked() -> None:
    on = measure(EngineConfig(runner="fake", num_kv_blocks=64, gc_freeze=True), 3, 4)
    off = measure(EngineConfig(runner="fake", num_kv_blocks=64, gc_freeze=False), 3, 4)
    assert on["frozen"] > 1000 and off["frozen"] == 0
    assert on["tracked"] < off["tracked"]  # frozen objects are not in gc.get_objects()
    for r in (on, off):
        assert {"gen0", "gen1", "gen2", "collect_ms", "seconds"} <= set(r)
