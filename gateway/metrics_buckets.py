"""vLLM's histogram bucket edges (vllm/v1/metrics/loggers.py), so a dashboard's bucket-based
queries read troupe's histograms as they read vLLM's."""

from __future__ import annotations

# vllm:e2e_request_latency_seconds and the phases (queue, prefill, decode, inference)
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# vllm:request_time_per_output_token_seconds (and its inter_token_latency_seconds)
TIME_PER_OUTPUT_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip

REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)  # vllm:request_params_n


def one_two_five_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value` (vLLM's build_1_2_5_buckets), for token
    counts bounded by the model's length limit; (1,) at least (an engine that never started
    reports a limit of 0, and a histogram needs a bucket)."""
    edges: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(edges) or (1,)
            edges.append(mantissa * scale)
        scale *= 10
