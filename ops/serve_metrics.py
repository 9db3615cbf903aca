"""Serving metrics from per-request timings, defined as vLLM's benchmark_serving defines them.

Per request (seconds, on the client's clock; `serve_client` stamps them):

    ttft     first content chunk's arrival minus the request's send time
    itl      gaps between successive content chunks (one list entry per gap)
    latency  (E2E) last content chunk's arrival minus the send time
    tpot     (latency - ttft) / (output_tokens - 1), only for requests with > 1 output token

A content chunk is one with a non-empty `choices` list (the usage-only chunk and [DONE] are not).
Over the run: throughputs divide by the wall time from the first send to the last answer;
the peak output throughput is the most content chunks of successful requests that arrived in
one whole second counted from the first of their sends (chunks, not tokens, as vLLM counts
them), and the peak concurrency the most successful requests in flight at once, each over
[send, last chunk);
percentiles interpolate linearly (numpy's default, as vLLM); an empty list reads 0. A request
is good (goodput) when every SLO given holds: ttft, tpot and e2el (vLLM's names), in ms; a
request with one output token has tpot 0 there, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SLO_METRICS = ("ttft", "tpot", "e2el")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestResult:
    """What the client saw of one request."""

    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0  # the server's usage.completion_tokens (else content chunks)
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    start: float = 0.0  # when it was sent (perf_counter seconds): the run's peaks line it up
    json_valid: bool | None = None  # a structured request's text parsed as JSON (else None)


@dataclass(frozen=True)
class Summary:
    """One latency metric in milliseconds."""

    mean: float
    median: float
    std: float
    percentiles: dict[float, float]


@dataclass(frozen=True)
class BenchMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float | None  # None without an SLO
    output_throughput: float
    total_token_throughput: float
    latencies: dict[str, Summary]  # ttft, tpot, itl, e2el
    peak_output_throughput: float = 0.0  # content chunks in the busiest second
    peak_concurrency: int = 0  # most requests in flight at once


def summarize(seconds: Sequence[float], percentiles: Sequence[float]) -> Summary:
    ms = np.asarray(seconds if len(seconds) else [0.0], dtype=np.float64) * 1000.0
    return Summary(
        mean=float(np.mean(ms)),
        median=float(np.median(ms)),
        std=float(np.std(ms)),
        percentiles={p: float(np.percentile(ms, p)) for p in percentiles},
    )


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """`["ttft:200", "tpot:20"]` -> {"ttft": 200.0, "tpot": 20.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"goodput SLOs are KEY:MS with KEY one of {SLO_METRICS}, got {item!r}")
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"goodput SLO {item!r}: {value!r} is not a number of ms") from None
        if not slos[name] >= 0:
            raise ValueError(f"goodput SLO {item!r} must be >= 0 ms")
    return slos


def compute_metrics(
    results: Sequence[RequestResult],
    duration_s: float,
    *,
    percentiles: Sequence[float] = (50, 90, 99),
    goodput: Mapping[str, float] | None = None,
) -> BenchMetrics:
    ttfts, tpots, itls, e2els, slo_tpots = [], [], [], [], []
    total_input = total_output = num_good = 0
    for r in results:
        if not r.success:
            continue
        total_input += r.prompt_len
        total_output += r.output_tokens
        tpot = 0.0  # one output token: no time per output token, counts as 0 for goodput
        if r.output_tokens > 1:
            tpot = (r.latency - r.ttft) / (r.output_tokens - 1)
            tpots.append(tpot)
        slo_tpots.append(tpot)
        ttfts.append(r.ttft)
        itls += r.itl
        e2els.append(r.latency)
        if goodput and _is_good(goodput, {"ttft": r.ttft, "tpot": tpot, "e2el": r.latency}):
            num_good += 1
    completed = len(ttfts)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    return BenchMetrics(
        completed=completed,
        failed=len(results) - completed,
        duration_s=duration_s,
        total_input=total_input,
        total_output=total_output,
        request_throughput=completed * per_s,
        request_goodput=num_good * per_s if goodput else None,
        output_throughput=total_output * per_s,
        total_token_throughput=(total_input + total_output) * per_s,
        latencies={
            name: summarize(values, percentiles)
            for name, values in zip(LATENCY_METRICS, (ttfts, tpots, itls, e2els), strict=True)
        },
        peak_output_throughput=peak_chunks_per_second(results),
        peak_concurrency=peak_in_flight(results),
    )


def peak_chunks_per_second(results: Sequence[RequestResult]) -> float:
    """Successful requests' content chunks in their busiest whole second (module doc)."""
    done = [r for r in results if r.success]
    if not done:
        return 0.0
    first = min(r.start for r in done)
    per_second: dict[int, int] = {}
    for r in done:
        at = r.start + r.ttft
        for gap in [0.0, *r.itl]:
            at += gap
            second = int(at - first)
            per_second[second] = per_second.get(second, 0) + 1
    return float(max(per_second.values()))


def peak_in_flight(results: Sequence[RequestResult]) -> int:
    """The most successful requests in flight at once, each over [start, start + latency):
    an end and a start at the same instant do not overlap."""
    edges = sorted(
        (t, step)
        for r in results
        if r.success
        for t, step in ((r.start, 1), (r.start + r.latency, -1))
    )
    peak = now = 0
    for _, step in edges:  # at one instant, ends (-1) sort before starts (+1)
        now += step
        peak = max(peak, now)
    return peak


def _is_good(slos: Mapping[str, float], seconds: Mapping[str, float]) -> bool:
    return all(seconds[name] <= limit / 1000.0 for name, limit in slos.items())  # as vLLM


def metrics_json(m: BenchMetrics) -> dict[str, Any]:
    """vLLM's result keys (`mean_ttft_ms`, `p99_itl_ms`, ...), so the two files line up."""
    out: dict[str, Any] = {
        "duration": m.duration_s,
        "completed": m.completed,
        "failed": m.failed,
        "total_input_tokens": m.total_input,
        "total_output_tokens": m.total_output,
        "request_throughput": m.request_throughput,
        "request_goodput": m.request_goodput,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
        "max_output_tokens_per_s": m.peak_output_throughput,
        "max_concurrent_requests": m.peak_concurrency,
    }
    for name, s in m.latencies.items():
        out[f"mean_{name}_ms"] = s.mean
        out[f"median_{name}_ms"] = s.median
        out[f"std_{name}_ms"] = s.std
        for p, value in s.percentiles.items():
            out[f"p{percentile_word(p)}_{name}_ms"] = value
    return out


def percentile_word(p: float) -> str:
    """99 -> "99", 99.9 -> "99.9" (vLLM's key spelling)."""
    return str(int(p)) if int(p) == p else str(p)
