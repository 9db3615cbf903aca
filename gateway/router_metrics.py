"""The router's Prometheus metrics, per replica, read from the ReplicaSet at scrape time.

troupe_router_requests_total{replica}     requests routed to the replica (retries included)
troupe_router_prefix_hits_total{replica}  of those, routed there for their prefix
troupe_router_failures_total{replica}     refused connections, 503s, streams it cut
troupe_router_in_flight{replica}          requests proxied and not yet ended
troupe_router_replica_up{replica}         1 while it gets traffic
troupe_router_tree_chars{replica}         prompt characters its prefix tree remembers
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from troupe.gateway.router_replicas import ReplicaSet


class ReplicaCollector(Collector):
    def __init__(self, replicas: ReplicaSet) -> None:
        self._replicas = replicas

    def collect(self) -> Iterator[Metric]:
        labels = ["replica"]
        routed = CounterMetricFamily(
            "troupe_router_requests", "Requests routed to each replica", labels=labels
        )
        hits = CounterMetricFamily(
            "troupe_router_prefix_hits",
            "Requests routed to a replica because its prefix tree held their prefix",
            labels=labels,
        )
        failures = CounterMetricFamily(
            "troupe_router_failures",
            "Refused connections, 503 answers and streams cut by the replica",
            labels=labels,
        )
        in_flight = GaugeMetricFamily(
            "troupe_router_in_flight", "Requests proxied and not yet ended", labels=labels
        )
        up = GaugeMetricFamily("troupe_router_replica_up", "1 while it gets traffic", labels=labels)
        tree = GaugeMetricFamily(
            "troupe_router_tree_chars", "Prompt characters its prefix tree holds", labels=labels
        )
        for r, t in zip(self._replicas.replicas, self._replicas.policy.trees, strict=True):
            routed.add_metric([r.url], r.num_routed)
            hits.add_metric([r.url], r.num_prefix_hits)
            failures.add_metric([r.url], r.num_failures)
            in_flight.add_metric([r.url], r.num_in_flight)
            up.add_metric([r.url], int(r.is_up))
            tree.add_metric([r.url], t.num_chars)
        yield from (routed, hits, failures, in_flight, up, tree)


def render_metrics(replicas: ReplicaSet) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReplicaCollector(replicas))
    return generate_latest(registry)
