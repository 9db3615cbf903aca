"""vLLM's scheduler-state metrics under troupe's names, read from engine.stats() at scrape time
(called by gateway/metrics.py's EngineStatsCollector). troupe's own families (requests_running,
kv_blocks_used{pool}, preemptions_total{mode}, ...) say the same in troupe's terms; these
let a vLLM dashboard or alert read troupe with `vllm:` replaced by `troupe_`."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily, Metric
from troupe.gateway.metrics_families import Families
from troupe.messages.events import STEP_TOKEN_BUCKETS, EngineStats


def vllm_engine_metrics(stats: EngineStats, model_name: str) -> Iterator[Metric]:
    by_name = Families(model_name)
    running = "Number of requests in model execution batches."
    by_name.gauge("troupe_num_requests_running", running, stats.num_running)
    # vLLM's V1 puts a preempted request back in its waiting queue: troupe's swapped ones too
    waiting = "Number of requests waiting to be processed (preempted ones included)."
    by_name.gauge("troupe_num_requests_waiting", waiting, stats.num_waiting + stats.num_swapped)
    total = stats.num_gpu_blocks
    usage = stats.num_gpu_blocks_used / total if total else 0.0
    by_name.gauge("troupe_kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
    preemptions = stats.num_preemptions_swap + stats.num_preemptions_recompute
    by_name.counter(
        "troupe_num_preemptions", "Cumulative number of preemption from the engine.", preemptions
    )
    queries = "Prefix cache queries, in terms of number of queried tokens."
    by_name.counter("troupe_prefix_cache_queries", queries, stats.prefix_cache_query_tokens)
    hits = "Prefix cache hits, in terms of number of cached tokens."
    by_name.counter("troupe_prefix_cache_hits", hits, stats.prefix_cache_hit_tokens)
    yield from by_name.families.values()
    yield _iteration_tokens(stats, model_name)


def _iteration_tokens(stats: EngineStats, model_name: str) -> Metric:
    """The scheduler's per-bucket step counts, made cumulative."""
    family = HistogramMetricFamily(
        "troupe_iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        labels=["model_name"],
    )
    counts = stats.steps_by_tokens or (0,) * (len(STEP_TOKEN_BUCKETS) + 1)
    edges = (*(str(float(edge)) for edge in STEP_TOKEN_BUCKETS), "+Inf")
    cumulative, buckets = 0, []
    for edge, count in zip(edges, counts, strict=True):
        cumulative += count
        buckets.append((edge, float(cumulative)))
    family.add_metric([model_name], buckets, sum_value=stats.num_step_tokens)
    return family
