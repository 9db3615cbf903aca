"""gateway/latency_histogram.py exports what prometheus_client's Histogram exports."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from troupe.gateway.latency_histogram import LatencyHistogram
from troupe.gateway.latency_window import bucket_counts

BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0)
VALUES = (0.0, 0.001, 0.0011, 0.05, 0.1, 3.0, 10.0, 99.0)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")  # when it was made: not a count
    }


def test_the_same_samples_as_prometheus_clients_histogram() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = LatencyHistogram("lat_seconds", "doc", BOUNDS, ours)
    reference = Histogram("lat_seconds", "doc", buckets=BOUNDS, registry=theirs)
    for value in VALUES:
        fast.observe(value)
        reference.observe(value)
    fast.observe(0.02, 3)  # three tokens of one delta
    for _ in range(3):
        reference.observe(0.02)
    assert _samples(ours) == pytest.approx(_samples(theirs))  # the sum: up to rounding
    assert bucket_counts(fast) == bucket_counts(reference)
    assert bucket_counts(fast)[1] == (2.0, 3.0, 8.0, 8.0, 10.0, 11.0)  # <= each bound, +Inf


def test_constant_labels_as_prometheus_clients_labelled_histogram() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = LatencyHistogram("lat_seconds", "doc", BOUNDS, ours, {"model_name": "m"})
    reference = Histogram(
        "lat_seconds", "doc", ["model_name"], buckets=BOUNDS, registry=theirs
    ).labels("m")
    for value in VALUES:
        fast.observe(value)
        reference.observe(value)
    assert _samples(ours) == pytest.approx(_samples(theirs))
    assert ("lat_seconds_count", (("model_name", "m"),)) in _samples(ours)


def test_buckets_must_increase() -> None:
    with pytest.raises(ValueError, match="lat_seconds: buckets must be increasing"):
        LatencyHistogram("lat_seconds", "doc", (0.1, 0.01), CollectorRegistry())
