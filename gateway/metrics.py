"""Prometheus metrics: outcomes and latencies from engine events, state from engine.stats().

`troupe_model_info{model_name} 1` names the model: its public id (the first
--served-model-name, else the engine's id), vLLM's `model_name` label, given once for the
whole server (all of this registry's series are its) instead of on every series.

Each app owns its CollectorRegistry, so several servers (tests) can live in one process.
Latencies come from the event listener (called on the event loop for every event the engine
dispatches); gauges and engine-side counters are read from `engine.stats()` at scrape time by
a custom collector, so they are never stale and cost nothing between scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from troupe.actors.lora_registry import public_name
from troupe.gateway.engine_api import EngineLike
from troupe.gateway.latency_histogram import LatencyHistogram
from troupe.gateway.served_models import ServedModels
from troupe.messages import (
    Aborted,
    Delta,
    EngineStats,
    Failed,
    Finished,
    Rejected,
    StreamEvent,
)

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


class ModelInfoCollector(Collector):
    """`troupe_model_info{model_name} 1`: the model's public id (gateway/served_models.py)."""

    def __init__(self, engine: EngineLike, served_model_name: Sequence[str]) -> None:
        self._engine = engine
        self._served_model_name = tuple(served_model_name)

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "troupe_model_info",
            "The model served (model_name: its public id)",
            labels=["model_name"],
        )
        info.add_metric([ServedModels.of(self._engine, self._served_model_name).model_id], 1)
        yield info


class EngineStatsCollector(Collector):
    """Reads engine.stats() at scrape time."""

    def __init__(self, engine: EngineLike) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats()
        running = GaugeMetricFamily("troupe_requests_running", "Requests in the running batch")
        running.add_metric([], stats.num_running)
        waiting = GaugeMetricFamily("troupe_requests_waiting", "Requests waiting to be scheduled")
        waiting.add_metric([], stats.num_waiting)
        swapped = GaugeMetricFamily("troupe_requests_swapped", "Requests preempted to CPU")
        swapped.add_metric([], stats.num_swapped)
        used = GaugeMetricFamily(
            "troupe_kv_blocks_used", "KV cache blocks owned by requests", labels=["pool"]
        )
        used.add_metric(["gpu"], stats.num_gpu_blocks_used)
        used.add_metric(["cpu"], stats.num_cpu_blocks_used)
        total = GaugeMetricFamily("troupe_kv_blocks_total", "KV cache blocks", labels=["pool"])
        total.add_metric(["gpu"], stats.num_gpu_blocks)
        total.add_metric(["cpu"], stats.num_cpu_blocks)
        cached = GaugeMetricFamily(
            "troupe_kv_blocks_cached", "Free GPU blocks holding reusable prefix KV"
        )
        cached.add_metric([], stats.num_gpu_blocks_cached)
        preemptions = CounterMetricFamily(
            "troupe_preemptions", "Preemptions by mode", labels=["mode"]
        )
        preemptions.add_metric(["swap"], stats.num_preemptions_swap)
        preemptions.add_metric(["recompute"], stats.num_preemptions_recompute)
        hits = CounterMetricFamily(
            "troupe_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache"
        )
        hits.add_metric([], stats.prefix_cache_hit_tokens)
        by_tier = CounterMetricFamily(
            "troupe_prefix_cache_tier_hit_tokens",
            "Prompt tokens served from the prefix cache, by the tier that held them",
            labels=["tier"],
        )
        cpu_hits = stats.prefix_cache_cpu_hit_tokens
        by_tier.add_metric(["gpu"], stats.prefix_cache_hit_tokens - cpu_hits)
        by_tier.add_metric(["cpu"], cpu_hits)
        queries = CounterMetricFamily(
            "troupe_prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache"
        )
        queries.add_metric([], stats.prefix_cache_query_tokens)
        steps = CounterMetricFamily("troupe_engine_steps", "Scheduling steps run")
        steps.add_metric([], stats.num_steps)
        yield from (running, waiting, swapped, used, total, cached, preemptions, hits, queries)
        yield from (steps, by_tier)
        yield from _spec_metrics(stats)
        if stats.max_loras:  # the engine serves adapters (known from its first stats on)
            yield _lora_info(stats)


def _lora_info(stats: EngineStats) -> Metric:
    """vLLM's lora_requests_info: the adapters in use as labels (their public names, sorted,
    comma-separated), the value the time they were read (Unix seconds). vLLM keeps a sample per
    label set ever seen, the latest the current one; this exports only the current one."""
    info = GaugeMetricFamily(
        "troupe_lora_requests_info",
        "LoRA adapters of the running and the waiting requests",
        labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
    )
    waiting, running = _names(stats.waiting_lora_adapters), _names(stats.running_lora_adapters)
    info.add_metric([str(stats.max_loras), waiting, running], time.time())
    return info


def _names(inside: tuple[str, ...]) -> str:
    """A reloaded adapter runs as "sql#2" inside the engine (actors/lora_registry.py): "sql"."""
    return ",".join(sorted({public_name(name) for name in inside}))


def _spec_metrics(stats: EngineStats) -> Iterator[Metric]:
    """Speculative decoding: proposed and accepted tokens, accepted length per verification."""
    proposed = CounterMetricFamily(
        "troupe_spec_decode_proposed_tokens", "Speculative tokens proposed and verified"
    )
    proposed.add_metric([], stats.num_spec_proposed_tokens)
    accepted = CounterMetricFamily(
        "troupe_spec_decode_accepted_tokens", "Speculative tokens accepted by the target"
    )
    accepted.add_metric([], stats.num_spec_accepted_tokens)
    lengths = HistogramMetricFamily(
        "troupe_spec_decode_accepted_length", "Proposals accepted per verification"
    )
    counts = stats.spec_accepted_lengths
    cumulative, buckets = 0, []
    for length, count in enumerate(counts):
        cumulative += count
        buckets.append((str(length), cumulative))
    buckets.append(("+Inf", cumulative))
    total = sum(length * count for length, count in enumerate(counts))
    lengths.add_metric([], buckets, sum_value=total)
    yield from (proposed, accepted, lengths)


class GatewayMetrics:
    """The app's registry; `on_event` is the engine event listener."""

    def __init__(self, engine: EngineLike, served_model_name: Sequence[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "troupe_requests",
            "Requests by terminal outcome (stop, length, aborted, rejected, failed)",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("stop", "length", "aborted", "rejected", "failed"):
            self.requests.labels(outcome)  # export zeros so rate() works from the first scrape
        self.ttft = LatencyHistogram(
            "troupe_time_to_first_token_seconds",
            "Arrival to first token",
            _LATENCY_BUCKETS,
            self.registry,
        )
        self.itl = LatencyHistogram(
            "troupe_inter_token_latency_seconds",
            "Time between consecutive output tokens of a request",
            _LATENCY_BUCKETS,
            self.registry,
        )
        self.e2e = LatencyHistogram(
            "troupe_e2e_request_latency_seconds",
            "Arrival to the terminal event",
            _LATENCY_BUCKETS,
            self.registry,
        )
        self.registry.register(ModelInfoCollector(engine, served_model_name))
        self.registry.register(EngineStatsCollector(engine))
        self._last_token_time: dict[str, float] = {}

    def on_event(self, event: StreamEvent, now: float) -> None:
        """Engine event listener: runs on the event loop for every event; keep it cheap."""
        if not isinstance(event, Rejected) and event.index:
            return  # parallel sampling: a request's latency and outcome are its sample 0's
        if event.token_ids:
            last = self._last_token_time.get(event.request_id)
            if last is not None:
                # A delta may carry several tokens: spread the gap over them.
                num_tokens = len(event.token_ids)
                self.itl.observe((now - last) / num_tokens, num_tokens)
            self._last_token_time[event.request_id] = now
        if isinstance(event, Delta):
            return
        self._last_token_time.pop(event.request_id, None)
        match event:
            case Finished():
                self.requests.labels(str(event.finish_reason)).inc()
                if event.timings.ttft is not None:
                    self.ttft.observe(event.timings.ttft)
                self.e2e.observe(event.timings.e2e)
            case Aborted():
                self.requests.labels("aborted").inc()
                if event.timings.ttft is not None:
                    self.ttft.observe(event.timings.ttft)
            case Rejected():
                self.requests.labels("rejected").inc()
            case Failed():
                self.requests.labels("failed").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
