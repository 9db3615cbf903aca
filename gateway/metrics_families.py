"""Gauge and counter families built at scrape time, each labelled `model_name` beside its own
labels (the collectors of gateway/metrics.py and gateway/metrics_engine_vllm.py)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class Families:
    """Metric families by name, each labelled `model_name` and its own labels."""

    def __init__(self, model_name: str) -> None:
        self._model_name = model_name
        self.families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def gauge(self, name: str, documentation: str, value: float, **labels: str) -> None:
        family = self.families.get(name)
        if family is None:
            family = GaugeMetricFamily(name, documentation, labels=["model_name", *labels])
            self.families[name] = family
        family.add_metric([self._model_name, *labels.values()], value)

    def counter(self, name: str, documentation: str, value: float, **labels: str) -> None:
        family = self.families.get(name)
        if family is None:
            family = CounterMetricFamily(name, documentation, labels=["model_name", *labels])
            self.families[name] = family
        family.add_metric([self._model_name, *labels.values()], value)
