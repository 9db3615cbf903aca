"""ops/step_timeline's report from GPU intervals (no GPU: made-up events)."""

from __future__ import annotations

from troupe.ops.step_timeline import by_family, summarize


def test_busy_idle_gaps_and_neighbours() -> None:
    events = [
        (0, 10_000, "nvjet_a"),
        (5_000, 10_000, "_rms_norm_kernel"),  # overlaps: busy counts the union
        (15_000, 5_000, "_decode_split_kernel"),
        (220_000, 10_000, "nvjet_b"),  # a 200 us gap after the decode kernel
        (233_000, 7_000, "Memcpy HtoD (Pinned -> Device)"),  # a 3 us gap
    ]
    lines = summarize(events)
    # span 240 us, busy 15 + 5 + 10 + 7 = 37 us (the overlap once), idle 203 us
    assert lines[0].endswith("(84.6%)")
    assert "gaps 0-5 us: 1, 0.0 ms" in lines and "gaps 100-1000 us: 1, 0.2 ms" in lines
    long_gaps = lines[lines.index(next(x for x in lines if x.startswith("gaps of 100"))) + 1]
    assert "_decode_split_kernel -> nvjet_b" in long_gaps and "x1" in long_gaps
    families = by_family(events)
    assert families == {
        "GEMMs": 20_000,
        "other": 10_000,
        "decode attention": 5_000,
        "copies": 7_000,
    }


def test_busy_is_the_union_of_intervals() -> None:
    lines = summarize([(0, 100, "a"), (50, 100, "b"), (400, 100, "c")])
    # span 500 ns, busy 150 + 100, idle 250: 50%
    assert lines[0].endswith("(50.0%)")
