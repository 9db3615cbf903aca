"""vLLM's per-request metrics under troupe's names, from the events the engine dispatches: the
terminal event's usage and timings (phases stamped in the engine: actors/core/streamer_timings.py)
and the tokens each event carries. Fed by gateway/metrics.py's GatewayMetrics.on_event on the
event loop, so: plain ints and lock-free histograms, exported at scrape time.

One observation per request, as troupe's other request metrics (parallel sampling: its sample
0's; vLLM observes each sample), except the generation tokens counter, which counts every
sample's tokens, and request_max_num_generation_tokens / request_params_n, observed once the
request's last sample ends. The histograms observe requests that finish (stop, length); the
outcome counter counts every ending that ran in the engine (stop, length, abort, error).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from troupe.gateway.latency_histogram import LatencyHistogram
from troupe.gateway.metrics_buckets import (
    REQUEST_LATENCY_BUCKETS,
    REQUEST_PARAMS_N_BUCKETS,
    TIME_PER_OUTPUT_TOKEN_BUCKETS,
    one_two_five_buckets,
)
from troupe.gateway.metrics_families import Families
from troupe.messages import Aborted, Delta, Failed, Finished

FINISHED_REASONS = ("stop", "length", "abort", "error")  # vLLM's FinishReason, as labelled


class _Counters(Collector):
    """Token and outcome counts; zeros exported from the first scrape, so rate() works."""

    def __init__(self, model_name: str) -> None:
        self._model_name = model_name
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.num_finished = dict.fromkeys(FINISHED_REASONS, 0)

    def collect(self) -> Iterator[Metric]:
        by_name = Families(self._model_name)
        prompt, generated = self.num_prompt_tokens, self.num_generation_tokens
        by_name.counter("troupe_prompt_tokens", "Number of prefill tokens processed.", prompt)
        by_name.counter(
            "troupe_generation_tokens", "Number of generation tokens processed.", generated
        )
        success = "Count of successfully processed requests."
        for reason, count in self.num_finished.items():
            by_name.counter("troupe_request_success", success, count, finished_reason=reason)
        yield from by_name.families.values()


class RequestMetrics:
    """Registered in `registry`; `max_model_len` bounds the token-count buckets (as vLLM's)."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int) -> None:
        labels = {"model_name": model_name}

        def histogram(
            name: str, documentation: str, buckets: tuple[float, ...]
        ) -> LatencyHistogram:
            return LatencyHistogram(name, documentation, buckets, registry, labels)

        phase, tokens = REQUEST_LATENCY_BUCKETS, one_two_five_buckets(max_model_len)
        self.counters = _Counters(model_name)
        registry.register(self.counters)
        self.queue = histogram(
            "troupe_request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            phase,
        )
        self.prefill = histogram(
            "troupe_request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            phase,
        )
        self.decode = histogram(
            "troupe_request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            phase,
        )
        self.inference = histogram(
            "troupe_request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            phase,
        )
        self.tpot = histogram(
            "troupe_request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            TIME_PER_OUTPUT_TOKEN_BUCKETS,
        )
        self.prompt_tokens = histogram(
            "troupe_request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.generation_tokens = histogram(
            "troupe_request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.prefill_kv_computed = histogram(
            "troupe_request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        self.max_tokens = histogram(
            "troupe_request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.params_n = histogram(
            "troupe_request_params_n",
            "Histogram of the n request parameter.",
            REQUEST_PARAMS_N_BUCKETS,
        )
        self.max_generation_tokens = histogram(
            "troupe_request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self._most_generated: dict[str, int] = {}  # requests with samples still open

    def on_tokens(self, num_tokens: int) -> None:
        """Any sample's event carried `num_tokens` new tokens."""
        self.counters.num_generation_tokens += num_tokens

    def on_first_token(self, event: Delta | Finished | Aborted | Failed) -> None:
        """The request's first tokens (its sample 0's): its prompt has been processed."""
        if isinstance(event, Delta):
            self.counters.num_prompt_tokens += event.prompt_tokens or 0
        elif not isinstance(event, Failed):
            self.counters.num_prompt_tokens += event.usage.prompt_tokens

    def on_finished(self, event: Finished) -> None:
        """The request's sample 0 finished (stop or length)."""
        self.counters.num_finished[str(event.finish_reason)] += 1
        timings, usage = event.timings, event.usage
        for histogram, seconds in (
            (self.queue, timings.queue),
            (self.prefill, timings.prefill),
            (self.decode, timings.decode),
            (self.inference, timings.inference),
        ):
            if seconds is not None:
                histogram.observe(seconds)
        self.tpot.observe(timings.tpot or 0.0)  # vLLM's 0 when there is no second token
        self.prompt_tokens.observe(usage.prompt_tokens)
        self.generation_tokens.observe(usage.completion_tokens)
        self.prefill_kv_computed.observe(usage.prompt_tokens - usage.cached_tokens)
        if event.params_max_tokens is not None:
            self.max_tokens.observe(event.params_max_tokens)

    def on_ended(self, event: Aborted | Failed) -> None:
        """The request's sample 0 was aborted or failed in the engine."""
        self.counters.num_finished["abort" if isinstance(event, Aborted) else "error"] += 1

    def on_sample_end(self, event: Finished | Aborted | Failed) -> None:
        """Any sample ended: the request's longest output, once its last sample ends."""
        most = self._most_generated.pop(event.request_id, 0)
        if not isinstance(event, Failed):
            most = max(most, event.usage.completion_tokens)
        if event.samples_left:
            self._most_generated[event.request_id] = most
        elif isinstance(event, Finished):
            self.max_generation_tokens.observe(most)
            self.params_n.observe(event.params_n)
