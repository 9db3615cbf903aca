"""ops/decode_order_sim: the makespans it reports are at least the ideal, and on the offline
workload longest first beats the batch order the decode kernel used before."""

from __future__ import annotations

from troupe.ops.decode_order_sim import makespan, ratios


def test_makespan_runs_programs_in_order_on_free_slots() -> None:
    assert makespan([5, 1, 1, 1, 1, 1], 2) == 5  # the short ones share the other slot
    assert makespan([1, 1, 1, 1, 1, 5], 2) == 7  # the long one starts last and runs alone


def test_longest_first_is_closest_to_the_ideal() -> None:
    got = ratios(4, every=32)
    assert 1.0 <= got["longest first"] < got["sorted per head"] < got["batch order"]
