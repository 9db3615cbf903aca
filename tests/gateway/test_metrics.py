"""GET /metrics: Prometheus text with the troupe_ families, values read from the engine."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from troupe.config import DEFAULT_MODEL_NAME

pytestmark = pytest.mark.anyio

MODEL = DEFAULT_MODEL_NAME  # the fake runner's engine serves it under its own id


async def _scrape(
    http: aiohttp.ClientSession, url: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with http.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            # every troupe_ series names the model, as vLLM's do (the served name)
            assert labels.pop("model_name", None) == MODEL, (s.name, s.labels)
            samples[(s.name, tuple(sorted(labels.items())))] = s.value
    return samples


async def test_metrics_count_requests_and_read_engine_stats(server) -> None:  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as http:
        before = await _scrape(http, server.url)
        for _ in range(2):
            body = {"prompt": "metrics please", "max_tokens": 4, "ignore_eos": True}
            async with http.post(f"{server.url}/v1/completions", json=body) as resp:
                assert resp.status == 200
        async with http.post(
            f"{server.url}/v1/completions", json={"prompt": "x", "top_p": 9}
        ) as resp:
            assert resp.status == 400  # turned away by the gateway: never reaches the engine
        body = {"prompt": "x", "stop_token_ids": [10**9]}
        async with http.post(f"{server.url}/v1/completions", json=body) as resp:
            assert resp.status == 400  # rejected by the engine: counted
        await asyncio.to_thread(server.wait_idle)
        after = await _scrape(http, server.url)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert delta("troupe_requests_total", outcome="length") == 2
    assert delta("troupe_requests_total", outcome="rejected") == 1
    assert delta("troupe_time_to_first_token_seconds_count") == 2
    assert delta("troupe_inter_token_latency_seconds_count") == 2 * 3  # 4 tokens: 3 gaps each
    # vLLM's families (test_metrics_vllm.py checks their values); the rejection is not counted
    assert delta("troupe_request_success_total", finished_reason="length") == 2
    assert delta("troupe_generation_tokens_total") == 2 * 4
    for phase in ("queue", "prefill", "decode", "inference"):
        assert delta(f"troupe_request_{phase}_time_seconds_count") == 2, phase
    assert delta("troupe_request_params_max_tokens_sum") == 2 * 4
    assert delta("troupe_iteration_tokens_total_count") == delta("troupe_engine_steps_total")
    assert after[("troupe_kv_blocks_total", (("pool", "gpu"),))] == server.config.num_kv_blocks
    assert after[("troupe_kv_blocks_total", (("pool", "cpu"),))] == server.config.num_cpu_blocks
    assert after[("troupe_kv_blocks_used", (("pool", "gpu"),))] == 0
    assert after[("troupe_requests_running", ())] == 0
    assert after[("troupe_requests_waiting", ())] == 0
    for mode in ("swap", "recompute"):
        assert ("troupe_preemptions_total", (("mode", mode),)) in after
    assert ("troupe_prefix_cache_hit_tokens_total", ()) in after
    assert after[("troupe_model_info", ())] == 1
    for family in ("troupe_e2e_request_latency_seconds_count", "troupe_engine_steps_total"):
        assert (family, ()) in after
    for tier in ("gpu", "cpu"):
        assert ("troupe_prefix_cache_tier_hit_tokens_total", (("tier", tier),)) in after


def test_speculative_decoding_metrics_from_stats() -> None:
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest
    from troupe.gateway.metrics import EngineStatsCollector
    from troupe.messages import EngineStats

    stats = EngineStats(
        num_spec_proposed_tokens=40,
        num_spec_accepted_tokens=17,
        spec_accepted_lengths=(5, 2, 0, 1, 3),
    )
    registry = CollectorRegistry()
    engine = SimpleNamespace(stats=lambda: stats)
    registry.register(EngineStatsCollector(engine, "m"))  # type: ignore[arg-type]
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            labels = dict(s.labels)
            assert labels.pop("model_name") == "m"
            samples[(s.name, tuple(sorted(labels.items())))] = s.value
    assert samples[("troupe_spec_decode_proposed_tokens_total", ())] == 40
    assert samples[("troupe_spec_decode_accepted_tokens_total", ())] == 17
    bucket = "troupe_spec_decode_accepted_length_bucket"
    assert [samples[(bucket, (("le", le),))] for le in ("0", "1", "2", "3", "4", "+Inf")] == [
        5,
        7,
        7,
        8,
        11,
        11,
    ]
    assert samples[("troupe_spec_decode_accepted_length_sum", ())] == 17
    assert samples[("troupe_spec_decode_accepted_length_count", ())] == 11
