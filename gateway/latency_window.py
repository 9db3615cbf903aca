"""Latency percentiles over the last minute, read from the gateway's Prometheus histograms.

The histograms (gateway/metrics.py) count since start. A window is the difference between
their buckets now and a snapshot of them taken about `window_s` ago, so this module keeps only
a few snapshots, taken when it is read (at most one per `min_interval_s`): no second record of
the latencies, and nothing at all while nobody looks. A percentile is interpolated inside the
bucket that holds it, as Prometheus' histogram_quantile does, so the page shows what a Grafana
panel over the same histogram shows.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from prometheus_client.registry import Collector


class Percentiles(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds; None when the window saw no observation."""

    count: int
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class _Snapshot:
    time: float
    cumulative: tuple[float, ...]  # observations <= each bound (the last bound is +Inf)


def bucket_counts(histogram: Collector) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(upper bounds, cumulative counts) of an unlabelled histogram, +Inf last."""
    pairs = [
        (float(s.labels["le"]), s.value)
        for metric in histogram.collect()
        for s in metric.samples
        if s.name.endswith("_bucket")
    ]
    pairs.sort()
    return tuple(b for b, _ in pairs), tuple(c for _, c in pairs)


def quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The q-quantile of cumulative bucket counts, linear inside its bucket (0 below the
    first bound); one past the last finite bound answers that bound."""
    total = cumulative[-1]
    if total <= 0:
        return None
    rank = q * total
    below = 0.0
    for i, count in enumerate(cumulative):
        if count >= rank and count > below:
            upper = bounds[i]
            lower = bounds[i - 1] if i > 0 else 0.0
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        below = count
    return bounds[-2] if len(bounds) > 1 else None


class LatencyWindow:
    """Percentiles of one histogram over about the last `window_s` seconds."""

    def __init__(
        self,
        histogram: Collector,
        *,
        now: float,
        window_s: float = 60.0,
        min_interval_s: float = 1.0,
    ) -> None:
        self._histogram = histogram
        self.window_s = window_s
        self._min_interval_s = min_interval_s
        bounds, counts = bucket_counts(histogram)
        self._bounds = bounds
        # The histogram's state when the window was made: the base until a minute has passed.
        self._snapshots = collections.deque([_Snapshot(now, counts)])

    def read(self, now: float) -> tuple[Percentiles, float]:
        """Percentiles since the base snapshot, and how many seconds that covers: about
        `window_s` while read often; longer after a pause in reading (said, not hidden)."""
        _, counts = bucket_counts(self._histogram)
        snapshots = self._snapshots
        if now - snapshots[-1].time >= self._min_interval_s:
            snapshots.append(_Snapshot(now, counts))
        # The base: the newest snapshot at least window_s old (or the oldest there is).
        while len(snapshots) > 1 and snapshots[1].time <= now - self.window_s:
            snapshots.popleft()
        base = snapshots[0]
        delta = [c - b for c, b in zip(counts, base.cumulative, strict=True)]
        stats = Percentiles(
            count=int(delta[-1]),
            p50=quantile(0.5, self._bounds, delta),
            p90=quantile(0.9, self._bounds, delta),
            p99=quantile(0.99, self._bounds, delta),
        )
        return stats, now - base.time
