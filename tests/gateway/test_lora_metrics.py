"""troupe_lora_requests_info (vLLM's lora_requests_info) on GET /metrics: labels naming the
adapters of the running and the waiting requests and max_lora, the value the time they were
read; exported only by an engine that serves adapters (from its first EngineStats on, as
vLLM's appears with its first stats), whether it runs in this process or in a child (the
stats come in its EventBatches)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from troupe.config import DEFAULT_MODEL_NAME
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread

ADAPTERS = ("sql=/adapters/sql", "chat-v2=/adapters/chat")
CONFIG = BASE_CONFIG.replace(lora_modules=ADAPTERS, max_loras=1)
HANG = 30.0  # s: a hang detector only
INFO = "troupe_lora_requests_info"


@pytest.fixture(scope="module")
def held() -> Iterator[ServerThread]:
    """One adapter at a time, the engine in this process around a FaultyRunner (`srv.runner`)."""
    runner = FaultyRunner(FakeRunner.from_config(CONFIG))
    srv = ServerThread(CONFIG, GatewaySettings(engine_process=False), runner=runner).start()
    yield srv
    runner.release()
    srv.shutdown()


def _lora_info(url: str) -> list[tuple[dict[str, str], float]]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=HANG) as resp:
        text = resp.read().decode()
    families = text_string_to_metric_families(text)
    samples = [(s.labels, s.value) for f in families if f.name == INFO for s in f.samples]
    for labels, _ in samples:  # the served model's, as on every troupe_ series
        assert labels.pop("model_name") == DEFAULT_MODEL_NAME
    return samples


def _labels(running: str, waiting: str, max_lora: str = "1") -> dict[str, str]:
    return {"running_lora_adapters": running, "waiting_lora_adapters": waiting,
            "max_lora": max_lora}  # fmt: skip


def _open_stream(url: str, model: str) -> Any:
    """A streamed completion on adapter `model`; returns once its first event is out."""
    body = {"model": model, "prompt": f"{model} query", "max_tokens": 4, "ignore_eos": True,
            "stream": True}  # fmt: skip
    req = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return urllib.request.urlopen(req, timeout=HANG)


def _scheduler_received(srv: ServerThread) -> int:
    graph = srv.call(srv.engine.graph_stats())
    return next(a.num_received for a in graph.actors if a.name == "scheduler")


def test_the_gauge_names_the_running_and_the_waiting_adapters(held: ServerThread) -> None:
    runner = held.runner
    received = _scheduler_received(held)
    runner.hold_after(0)  # the first step (sql's prefill) waits
    with ThreadPoolExecutor(2) as pool:
        try:
            sql = pool.submit(_open_stream, held.url, "sql")
            assert runner.wait_until_held(HANG, num_held=runner.num_held + 1)
            chat = pool.submit(_open_stream, held.url, "chat-v2")
            # While the step is held the scheduler takes sql's request, its allocation and
            # then chat-v2's request: all three in before the step's result.
            deadline = time.monotonic() + HANG
            while _scheduler_received(held) < received + 3:
                assert time.monotonic() < deadline, "chat-v2's request never reached the scheduler"
                time.sleep(0.01)
            runner.hold_after(0)  # the step runs; the next (sql's decode alone) waits
            first = sql.result(HANG)  # its first event came with the step's stats
            before = time.time()
            ((labels, value),) = _lora_info(held.url)
            assert labels == _labels("sql", "chat-v2")  # chat-v2 waits: max_loras is 1
            assert before <= value <= time.time()
        finally:
            runner.release()
        assert b"[DONE]" in first.read() and b"[DONE]" in chat.result(HANG).read()
    held.wait_idle()
    assert [labels for labels, _ in _lora_info(held.url)] == [_labels("", "")]


def test_an_engine_process_exports_it_and_one_without_adapters_does_not(server) -> None:  # type: ignore[no-untyped-def]
    assert server.engine.lora_adapters == {} and _lora_info(server.url) == []
    child = ServerThread(CONFIG.replace(max_loras=2), GatewaySettings()).start()
    try:
        assert child.engine.pid  # a RemoteEngine
        _open_stream(child.url, "sql").read()
        child.wait_idle()
        assert [labels for labels, _ in _lora_info(child.url)] == [_labels("", "", "2")]
    finally:
        child.shutdown()


def test_the_labels_give_public_names_and_no_adapters_no_gauge() -> None:
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest
    from troupe.gateway.metrics import EngineStatsCollector
    from troupe.messages import EngineStats

    def samples(stats: EngineStats) -> list[tuple[dict[str, str], float]]:
        registry = CollectorRegistry()
        registry.register(EngineStatsCollector(SimpleNamespace(stats=lambda: stats), "m"))  # type: ignore[arg-type]
        families = text_string_to_metric_families(generate_latest(registry).decode())
        found = [(s.labels, s.value) for f in families if f.name == INFO for s in f.samples]
        assert all(labels.pop("model_name") == "m" for labels, _ in found)
        return found

    # "sql#2": a reloaded sql inside the engine (actors/lora_registry.py), beside the old one
    stats = EngineStats(max_loras=4, running_lora_adapters=("b", "sql", "sql#2"),
                        waiting_lora_adapters=("a#3",))  # fmt: skip
    ((labels, _),) = samples(stats)
    assert labels == _labels("b,sql", "a", "4")
    assert samples(EngineStats(running_lora_adapters=("sql",))) == []  # max_loras 0: none
