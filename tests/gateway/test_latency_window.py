"""Latency percentiles over a window, from cumulative Prometheus histograms (fake clock)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram
from troupe.gateway.latency_window import LatencyWindow, bucket_counts, quantile

BOUNDS = (0.1, 0.2, 0.5, 1.0)


def _histogram() -> Histogram:
    return Histogram("lat_seconds", "test", buckets=BOUNDS, registry=CollectorRegistry())


def test_quantile_interpolates_inside_its_bucket() -> None:
    bounds = (*BOUNDS, float("inf"))
    # 10 in (0, 0.1], 10 in (0.1, 0.2], none above.
    cumulative = (10.0, 20.0, 20.0, 20.0, 20.0)
    assert quantile(0.5, bounds, cumulative) == pytest.approx(0.1)
    assert quantile(0.25, bounds, cumulative) == pytest.approx(0.05)
    assert quantile(0.75, bounds, cumulative) == pytest.approx(0.15)
    assert quantile(0.99, bounds, cumulative) == pytest.approx(0.198)
    assert quantile(0.5, bounds, (0.0,) * 5) is None
    # Past the last finite bound: that bound (histogram_quantile does the same).
    assert quantile(0.9, bounds, (0.0, 0.0, 0.0, 1.0, 10.0)) == 1.0


def test_bucket_counts_reads_the_histogram() -> None:
    hist = _histogram()
    for value in (0.05, 0.15, 0.15, 3.0):
        hist.observe(value)
    bounds, cumulative = bucket_counts(hist)
    assert bounds == (*BOUNDS, float("inf"))
    assert cumulative == (1.0, 3.0, 3.0, 3.0, 4.0)


def test_window_forgets_what_is_older_than_a_minute() -> None:
    hist = _histogram()
    window = LatencyWindow(hist, now=1000.0)
    for _ in range(10):
        hist.observe(0.9)  # slow, early
    stats, seconds = window.read(1001.0)
    assert (stats.count, seconds) == (10, 1.0)
    assert stats.p50 == pytest.approx(0.75)
    window.read(1030.0)  # a reader comes by every now and then
    for _ in range(4):
        hist.observe(0.05)  # fast, later
    stats, seconds = window.read(1075.0)  # the snapshot at 1001 is now the base
    assert (stats.count, seconds) == (4, 74.0)
    assert stats.p50 == pytest.approx(0.05)
    stats, seconds = window.read(1091.0)  # now the one at 1030: still only the fast four
    assert (stats.count, seconds) == (4, 61.0)
    stats, seconds = window.read(1200.0)  # nothing new for two minutes
    assert stats.count == 0
    assert stats.p50 is None and stats.p99 is None


def test_reads_within_the_interval_keep_one_snapshot() -> None:
    hist = _histogram()
    window = LatencyWindow(hist, now=0.0, window_s=10.0, min_interval_s=1.0)
    hist.observe(0.3)
    for tick in range(100):  # 100 reads in 0.99 s: no snapshot added
        stats, _ = window.read(tick / 100)
    assert stats.count == 1
    hist.observe(0.3)
    stats, _ = window.read(20.0)  # the base is still the start: both count
    assert stats.count == 2
