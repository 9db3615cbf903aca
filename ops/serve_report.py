"""The serving benchmark's report: a table for people, a JSON file for tools.

The JSON uses vLLM's keys (`request_throughput`, `mean_ttft_ms`, `p99_itl_ms`, `ttfts`, ...)
plus the run's settings, so results of `troupe bench serve` and `vllm bench serve` line up.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from troupe.ops.serve_cpu import ServerCpu
from troupe.ops.serve_metrics import BenchMetrics, RequestResult, metrics_json, percentile_word

_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E"}
_WIDTH = 50


def format_report(m: BenchMetrics, settings: Mapping[str, Any], errors: Sequence[str]) -> str:
    """vLLM's summary lines, then one row per latency metric (ms)."""
    rate = settings["request_rate"]
    rows: list[tuple[str, str]] = [
        ("Mode", str(settings["mode"])),
        *([("Server", str(settings["base_url"]))] if settings.get("base_url") else []),
        ("Offered request rate (req/s)", _offered(rate, settings)),
        ("Burstiness", f"{settings['burstiness']:g}"),
        ("Max concurrency", str(settings["max_concurrency"])),
        *(
            [("Connections opened before", str(n))]
            if (n := settings.get("warm_connections"))
            else []
        ),
        ("Successful requests", str(m.completed)),
        ("Failed requests", str(m.failed)),
        ("Benchmark duration (s)", f"{m.duration_s:.2f}"),
        ("Total input tokens", str(m.total_input)),
        ("Total generated tokens", str(m.total_output)),
        ("Request throughput (req/s)", f"{m.request_throughput:.2f}"),
    ]
    if m.request_goodput is not None:
        slo = " ".join(f"{k}:{v:g}" for k, v in settings["goodput"].items())
        rows.append((f"Request goodput (req/s) [{slo} ms]", f"{m.request_goodput:.2f}"))
    rows += [
        ("Output token throughput (tok/s)", f"{m.output_throughput:.2f}"),
        ("Total token throughput (tok/s)", f"{m.total_token_throughput:.2f}"),
        ("Peak output token throughput (tok/s)", f"{m.peak_output_throughput:.2f}"),
        ("Peak concurrent requests", str(m.peak_concurrency)),
    ]
    cpu = settings.get("server_cpu")
    if cpu is not None:
        engine = "in gateway" if cpu["engine_s"] is None else f"{cpu['engine_s']:.2f}"
        rows += [
            ("Gateway CPU (s) / per output token (us)", f"{cpu['gateway_s']:.2f} / "
             f"{cpu['gateway_us_per_output_token']:.1f}"),
            ("Engine process CPU (s)", engine),
        ]  # fmt: skip
    structured = settings.get("structured")
    if structured:  # the requests asking for JSON, and how many outputs parse
        rows.append(("Structured requests / valid JSON", f"{structured['requests']} / "
                     f"{structured['valid_json']}"))  # fmt: skip
    server_ttft = settings.get("server_ttft_ms")
    if server_ttft:  # the server's own, from its arrival stamp (ops/server_ttft.py)
        names = " / ".join(server_ttft)
        cells = " / ".join(f"{v:.1f}" for v in server_ttft.values())
        rows.append((f"Server TTFT {names} (ms)", cells))
    label_width = max(len(name) for name, _ in rows) + 2
    lines = [" Serving Benchmark Result ".center(_WIDTH, "=")]
    lines += [f"{name + ':':<{label_width}}{value:>{_WIDTH - label_width}}" for name, value in rows]
    percentiles = list(next(iter(m.latencies.values())).percentiles)
    head = f"{'(ms)':<6}{'mean':>9}" + "".join(
        f"{'p' + percentile_word(p):>9}" for p in percentiles
    )
    lines += ["-" * _WIDTH, head]
    for name, s in m.latencies.items():
        values = [s.mean, *s.percentiles.values()]
        lines.append(f"{_NAMES[name]:<6}" + "".join(f"{v:>9.2f}" for v in values))
    lines.append("=" * _WIDTH)
    for error in list(dict.fromkeys(errors))[:5]:  # the distinct ones, not a wall of repeats
        lines.append(f"error: {error}")
    return "\n".join(lines)


def _offered(rate: Any, settings: Mapping[str, Any]) -> str:
    if (strategy := settings.get("ramp_up_strategy")) is not None:
        start, end = settings["ramp_up_start_rps"], settings["ramp_up_end_rps"]
        return f"{strategy} ramp {start:g} -> {end:g}"
    return "inf" if rate == "inf" else f"{rate:g}"


def print_report(
    m: BenchMetrics,
    settings: Mapping[str, Any],
    results: Sequence[RequestResult],
    stream: TextIO | None = None,
) -> None:
    errors = [r.error for r in results if not r.success]
    print(format_report(m, settings, errors), file=stream)


def result_json(
    m: BenchMetrics, settings: Mapping[str, Any], results: Sequence[RequestResult]
) -> dict[str, Any]:
    """Settings, vLLM's metric keys, then per-request lists (in request order)."""
    return {
        **settings,
        **metrics_json(m),
        "input_lens": [r.prompt_len for r in results],
        "output_lens": [r.output_tokens if r.success else 0 for r in results],
        "ttfts": [r.ttft for r in results],
        "itls": [r.itl for r in results],
        "e2els": [r.latency for r in results],
        "errors": [r.error for r in results],
        "json_valid": [r.json_valid for r in results],
    }


def server_cpu_json(cpu: ServerCpu | None, num_output_tokens: int) -> dict[str, Any] | None:
    """A started server's CPU seconds during the run: the gateway's (and per output token, in
    microseconds) and the engine child's (None when the engine ran in the gateway's process)."""
    if cpu is None:
        return None
    per_token = cpu.gateway_s / num_output_tokens * 1e6 if num_output_tokens else 0.0
    return {
        "gateway_s": cpu.gateway_s,
        "engine_s": cpu.engine_s,
        "gateway_us_per_output_token": per_token,
    }


def write_result(path: str, data: Mapping[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")


def rate_json(rate: float) -> float | str:
    """Strict JSON has no infinity: vLLM writes the string "inf"."""
    return "inf" if math.isinf(rate) else rate
