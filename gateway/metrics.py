"""Prometheus metrics: outcomes and latencies from engine events, state from engine.stats().

Every series carries `model_name`, as vLLM's do: the model's public id (the first
--served-model-name, else the engine's id), the one `troupe_model_info{model_name} 1` names,
beside the series' own labels (outcome, pool, mode, ...), which are unchanged.

Each app owns its CollectorRegistry, so several servers (tests) can live in one process.
Latencies come from the event listener (called on the event loop for every event the engine
dispatches); gauges and engine-side counters are read from `engine.stats()` at scrape time by
a custom collector, so they are never stale and cost nothing between scrapes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from troupe.actors.lora_registry import public_name
from troupe.gateway.engine_api import EngineLike
from troupe.gateway.latency_histogram import LatencyHistogram
from troupe.gateway.metrics_engine_vllm import vllm_engine_metrics
from troupe.gateway.metrics_families import Families
from troupe.gateway.metrics_requests import RequestMetrics
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

    def __init__(self, model_name: str) -> None:
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "troupe_model_info",
            "The model served (model_name: its public id)",
            labels=["model_name"],
        )
        info.add_metric([self._model_name], 1)
        yield info


class EngineStatsCollector(Collector):
    """Reads engine.stats() at scrape time; every series labelled with `model_name`."""

    def __init__(self, engine: EngineLike, model_name: str) -> None:
        self._engine = engine
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats, model = self._engine.stats(), self._model_name
        by_name = Families(model)
        gauge, counter = by_name.gauge, by_name.counter
        gauge("troupe_requests_running", "Requests in the running batch", stats.num_running)
        gauge("troupe_requests_waiting", "Requests waiting to be scheduled", stats.num_waiting)
        gauge("troupe_requests_swapped", "Requests preempted to CPU", stats.num_swapped)
        used = "KV cache blocks owned by requests"
        gauge("troupe_kv_blocks_used", used, stats.num_gpu_blocks_used, pool="gpu")
        gauge("troupe_kv_blocks_used", used, stats.num_cpu_blocks_used, pool="cpu")
        gauge("troupe_kv_blocks_total", "KV cache blocks", stats.num_gpu_blocks, pool="gpu")
        gauge("troupe_kv_blocks_total", "KV cache blocks", stats.num_cpu_blocks, pool="cpu")
        cached = "Free GPU blocks holding reusable prefix KV"
        gauge("troupe_kv_blocks_cached", cached, stats.num_gpu_blocks_cached)
        swap, recompute = stats.num_preemptions_swap, stats.num_preemptions_recompute
        counter("troupe_preemptions", "Preemptions by mode", swap, mode="swap")
        counter("troupe_preemptions", "Preemptions by mode", recompute, mode="recompute")
        hits = "Prompt tokens served from the prefix cache"
        counter("troupe_prefix_cache_hit_tokens", hits, stats.prefix_cache_hit_tokens)
        queries = "Prompt tokens looked up in the prefix cache"
        counter("troupe_prefix_cache_query_tokens", queries, stats.prefix_cache_query_tokens)
        counter("troupe_engine_steps", "Scheduling steps run", stats.num_steps)
        by_tier = "Prompt tokens served from the prefix cache, by the tier that held them"
        cpu_hits = stats.prefix_cache_cpu_hit_tokens
        gpu_hits = stats.prefix_cache_hit_tokens - cpu_hits
        counter("troupe_prefix_cache_tier_hit_tokens", by_tier, gpu_hits, tier="gpu")
        counter("troupe_prefix_cache_tier_hit_tokens", by_tier, cpu_hits, tier="cpu")
        yield from by_name.families.values()
        yield from _spec_metrics(stats, model)
        yield from vllm_engine_metrics(stats, model)
        if stats.max_loras:  # the engine serves adapters (known from its first stats on)
            yield _lora_info(stats, model)


def _lora_info(stats: EngineStats, model_name: str) -> Metric:
    """vLLM's lora_requests_info: the adapters in use as labels (their public names, sorted,
    comma-separated), the value the time they were read (Unix seconds). vLLM keeps a sample per
    label set ever seen, the latest the current one; this exports only the current one."""
    info = GaugeMetricFamily(
        "troupe_lora_requests_info",
        "LoRA adapters of the running and the waiting requests",
        labels=["model_name", "max_lora", "waiting_lora_adapters", "running_lora_adapters"],
    )
    waiting, running = _names(stats.waiting_lora_adapters), _names(stats.running_lora_adapters)
    info.add_metric([model_name, str(stats.max_loras), waiting, running], time.time())
    return info


def _names(inside: tuple[str, ...]) -> str:
    """A reloaded adapter runs as "sql#2" inside the engine (actors/lora_registry.py): "sql"."""
    return ",".join(sorted({public_name(name) for name in inside}))


def _spec_metrics(stats: EngineStats, model_name: str) -> Iterator[Metric]:
    """Speculative decoding: proposed and accepted tokens, accepted length per verification."""
    by_name = Families(model_name)
    proposed = "Speculative tokens proposed and verified"
    by_name.counter("troupe_spec_decode_proposed_tokens", proposed, stats.num_spec_proposed_tokens)
    accepted = "Speculative tokens accepted by the target"
    by_name.counter("troupe_spec_decode_accepted_tokens", accepted, stats.num_spec_accepted_tokens)
    lengths = HistogramMetricFamily(
        "troupe_spec_decode_accepted_length",
        "Proposals accepted per verification",
        labels=["model_name"],
    )
    counts = stats.spec_accepted_lengths
    cumulative, buckets = 0, []
    for length, count in enumerate(counts):
        cumulative += count
        buckets.append((str(length), cumulative))
    buckets.append(("+Inf", cumulative))
    total = sum(length * count for length, count in enumerate(counts))
    lengths.add_metric([model_name], buckets, sum_value=total)
    yield from by_name.families.values()
    yield lengths


class GatewayMetrics:
    """The app's registry; `on_event` is the engine event listener."""

    def __init__(self, engine: EngineLike, served_model_name: Sequence[str] = ()) -> None:
        """The engine has started: its model's public id is known and fixed from here on."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model = ServedModels.of(engine, tuple(served_model_name)).model_id
        requests = Counter(
            "troupe_requests",
            "Requests by terminal outcome (stop, length, aborted, rejected, failed)",
            ["model_name", "outcome"],
            registry=self.registry,
        )
        # one child per outcome, zeros exported so rate() works from the first scrape
        self._outcomes = {
            outcome: requests.labels(model, outcome)
            for outcome in ("stop", "length", "aborted", "rejected", "failed")
        }
        self.requests = requests
        labels = {"model_name": model}
        self.ttft = LatencyHistogram(
            "troupe_time_to_first_token_seconds",
            "Arrival to first token",
            _LATENCY_BUCKETS,
            self.registry,
            labels,
        )
        self.itl = LatencyHistogram(
            "troupe_inter_token_latency_seconds",
            "Time between consecutive output tokens of a request",
            _LATENCY_BUCKETS,
            self.registry,
            labels,
        )
        self.e2e = LatencyHistogram(
            "troupe_e2e_request_latency_seconds",
            "Arrival to the terminal event",
            _LATENCY_BUCKETS,
            self.registry,
            labels,
        )
        self.vllm = RequestMetrics(self.registry, model, engine.max_model_len)
        self.registry.register(ModelInfoCollector(model))
        self.registry.register(EngineStatsCollector(engine, model))
        self._last_token_time: dict[str, float] = {}

    def on_event(self, event: StreamEvent, now: float) -> None:
        """Engine event listener: runs on the event loop for every event; keep it cheap."""
        if isinstance(event, Rejected):
            self._outcomes["rejected"].inc()
            return
        if event.token_ids:
            self.vllm.on_tokens(len(event.token_ids))  # every sample's
        if not isinstance(event, Delta):
            self.vllm.on_sample_end(event)
        if event.index:
            return  # parallel sampling: a request's latency and outcome are its sample 0's
        if event.token_ids:
            last = self._last_token_time.get(event.request_id)
            if last is not None:
                # A delta may carry several tokens: spread the gap over them.
                num_tokens = len(event.token_ids)
                self.itl.observe((now - last) / num_tokens, num_tokens)
            else:  # its first tokens: its prompt was processed
                self.vllm.on_first_token(event)
            self._last_token_time[event.request_id] = now
        if isinstance(event, Delta):
            return
        self._last_token_time.pop(event.request_id, None)
        match event:
            case Finished():
                self._outcome(str(event.finish_reason)).inc()
                if event.timings.ttft is not None:
                    self.ttft.observe(event.timings.ttft)
                self.e2e.observe(event.timings.e2e)
                self.vllm.on_finished(event)
            case Aborted():
                self._outcomes["aborted"].inc()
                if event.timings.ttft is not None:
                    self.ttft.observe(event.timings.ttft)
                self.vllm.on_ended(event)
            case Failed():
                self._outcomes["failed"].inc()
                self.vllm.on_ended(event)

    def _outcome(self, outcome: str) -> Counter:
        """The requests counter's child for `outcome` (a finish reason beyond the five: made
        on first use)."""
        child = self._outcomes.get(outcome)
        if child is None:
            child = self._outcomes[outcome] = self.requests.labels(self.model_name, outcome)
        return child

    def render(self) -> bytes:
        return generate_latest(self.registry)
