"""`troupe bench serve`'s peaks, as vLLM defines them: content chunks in the busiest whole
second, and the most requests in flight at once (hand-made timings)."""

from __future__ import annotations

from troupe.ops.serve_metrics import RequestResult, compute_metrics, metrics_json
from troupe.ops.serve_report import format_report


def _results() -> list[RequestResult]:
    return [
        # chunks at 0.5, 0.8, 1.1, 1.4; in flight over [0, 1.4)
        RequestResult(True, 8, 4, ttft=0.5, latency=1.4, itl=[0.3, 0.3, 0.3], start=0.0),
        # chunks at 0.3, 0.5; in flight over [0.2, 0.5)
        RequestResult(True, 8, 2, ttft=0.1, latency=0.3, itl=[0.2], start=0.2),
        # a chunk at 1.6; in flight over [1.4, 1.6): it starts as the first one ends
        RequestResult(True, 8, 1, ttft=0.2, latency=0.2, start=1.4),
        # failed: neither its chunks nor its time in flight count
        RequestResult(False, 8, 0, ttft=0.05, latency=5.0, itl=[0.1] * 9, start=0.1, error="x"),
    ]


def test_peaks_count_successful_requests_only() -> None:
    m = compute_metrics(_results(), 2.0)
    # second 0 (from the first send): 0.5, 0.8, 0.3, 0.5; second 1: 1.1, 1.4, 1.6
    assert m.peak_output_throughput == 4.0
    assert m.peak_concurrency == 2  # the first two; the third starts as the first ends
    keys = metrics_json(m)
    assert (keys["max_output_tokens_per_s"], keys["max_concurrent_requests"]) == (4.0, 2)
    settings = {"mode": "http", "request_rate": "inf", "burstiness": 1.0, "max_concurrency": None}
    report = format_report(m, settings, [])
    assert "Peak output token throughput (tok/s):" in report
    assert "Peak concurrent requests:" in report


def test_a_run_without_successes_has_no_peaks() -> None:
    m = compute_metrics([_results()[-1]], 1.0)
    assert (m.peak_output_throughput, m.peak_concurrency) == (0.0, 0)
