"""Helpers of the metrics tests: an engine stub for GatewayMetrics and a parsed /metrics page."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from troupe.messages import EngineStats

MODEL = "tiny"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class StubEngine:
    """What GatewayMetrics reads of an engine: its name, length limit and latest stats."""

    model_name = MODEL
    max_model_len = 64  # token buckets 1, 2, 5, 10, 20, 50
    lora_adapters: dict[str, str] = {}  # noqa: RUF012

    def __init__(self) -> None:
        self.latest = EngineStats()

    def stats(self) -> EngineStats:
        return self.latest


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            assert labels.pop("model_name", None) == MODEL, (s.name, s.labels)
            samples[(s.name, tuple(sorted(labels.items())))] = s.value
    return samples


def buckets(samples: Samples, name: str) -> dict[str, float]:
    """le -> cumulative count of histogram `name`."""
    return {
        dict(labels)["le"]: value
        for (sample, labels), value in samples.items()
        if sample == f"{name}_bucket"
    }


def summary(samples: Samples, name: str, *les: str) -> tuple[float, ...]:
    """count, sum, and the cumulative counts at `les`."""
    cumulative = buckets(samples, name)
    count, total = samples[(f"{name}_count", ())], samples[(f"{name}_sum", ())]
    return (count, total, *(cumulative[le] for le in les))
