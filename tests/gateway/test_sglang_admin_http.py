"""SGLang's native admin endpoints over HTTP (gateway/sglang_admin.py): model info, the deep
health check, /flush_cache emptying the prefix cache, /abort_request ending a /generate by its
rid with finish_reason "abort" (the runner held mid-request, so no timing decides it), and
release/resume of memory as sleep mode; the mutating ones through the router to every replica."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.fake_sleep import SleepyFakeRunner
from troupe.gpu.faulty_runner import FaultyRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.router_harness import RouterThread

LONG = " ".join(f"word{i}" for i in range(80))  # several KV blocks of prompt


def _call(url: str, path: str, body: Any = None, method: str = "POST") -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{url}{path}", data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            raw = resp.read()
            is_json = resp.headers.get("Content-Type", "").startswith("application/json")
            return resp.status, json.loads(raw) if is_json else raw.decode()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw else ""


def _cached(url: str) -> int:
    status, answer = _call(url, "/v1/completions", {"prompt": LONG, "max_tokens": 1})
    assert status == 200, answer
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_model_info_and_health_generate(server) -> None:  # type: ignore[no-untyped-def]
    status, info = _call(server.url, "/get_model_info", method="GET")
    assert status == 200 and info["is_generation"] is True
    base = server.gateway.served_models().base
    assert (info["model_path"], info["tokenizer_path"], info["weight_version"]) == (
        base,
        base,
        "default",
    )
    assert _call(server.url, "/health_generate", method="GET") == (200, "")


def test_flush_cache_empties_the_prefix_cache(server) -> None:  # type: ignore[no-untyped-def]
    _cached(server.url)
    assert _cached(server.url) > 0  # the second run finds the first's blocks
    for method in ("POST", "GET"):
        assert _call(server.url, "/flush_cache", method=method) == (200, "Cache flushed.\n")
        assert _cached(server.url) == 0
        assert _cached(server.url) > 0


@pytest.mark.parametrize("how", ["rid", "abort_all"])
def test_abort_request_ends_a_generate_with_abort(make_server, how: str) -> None:  # type: ignore[no-untyped-def]
    runner = FaultyRunner(FakeRunner.from_config(BASE_CONFIG))
    server = make_server(BASE_CONFIG, runner=runner)
    runner.hold_after(2)
    sampling = {"max_new_tokens": 1000, "ignore_eos": True}

    async def run() -> Any:
        async with aiohttp.ClientSession() as http:
            body = {"text": "roll out", "rid": "roll-1", "sampling_params": sampling}
            task = asyncio.create_task(http.post(f"{server.url}/generate", json=body))
            assert await asyncio.to_thread(runner.wait_until_held, 120)  # a hang guard only
            abort = {"rid": "roll-1"} if how == "rid" else {"abort_all": True}
            other = await http.post(f"{server.url}/abort_request", json={"rid": "not-running"})
            assert other.status == 200
            async with http.post(f"{server.url}/abort_request", json=abort) as resp:
                assert resp.status == 200
            runner.release()
            async with await task as resp:
                assert resp.status == 200
                return await resp.json()

    out = asyncio.run(run())
    meta = out["meta_info"]
    assert meta["id"] == "roll-1" and meta["finish_reason"]["type"] == "abort", meta
    assert "abort_request" in meta["finish_reason"]["message"]
    assert len(out["output_ids"]) == meta["completion_tokens"] < 1000


def test_release_and_resume_memory() -> None:
    config = BASE_CONFIG.replace(enable_sleep_mode=True)
    runner = SleepyFakeRunner(FakeRunner.from_config(config))
    server = ServerThread(config, GatewaySettings(), runner=runner).start()
    try:
        url = server.url
        status, error = _call(url, "/release_memory_occupation", {"tags": ["kv_cache"]})
        assert status == 400 and error["error"]["param"] == "tags", error
        status, answer = _call(url, "/release_memory_occupation")
        assert status == 200 and answer["is_sleeping"], answer
        assert _call(url, "/health_generate", method="GET") == (503, "")  # not left waiting
        assert _call(url, "/is_sleeping", method="GET") == (200, {"is_sleeping": True})
        status, answer = _call(url, "/resume_memory_occupation", {"tags": ["weights"]})
        assert status == 200 and answer["is_sleeping"]  # the KV cache still sleeps
        status, answer = _call(url, "/resume_memory_occupation", method="GET")
        assert status == 200 and not answer["is_sleeping"], answer
        assert _cached(url) == 0  # serving again
        assert _call(url, "/health_generate", method="GET") == (200, "")
    finally:
        server.shutdown()


def test_the_router_sends_them_to_every_replica(server) -> None:  # type: ignore[no-untyped-def]
    settings = RouterSettings(backend_urls=(server.url,), health_check_interval_s=3600.0)
    router = RouterThread().start_router(settings)
    try:
        _cached(server.url)
        status, answer = _call(router.url, "/flush_cache")
        assert status == 200 and answer["success"] and answer["replicas"] == 1, answer
        assert _cached(server.url) == 0
        status, answer = _call(router.url, "/abort_request", {"rid": "none"})
        assert status == 200 and answer["success"], answer
    finally:
        router.close()


def test_behind_the_key(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(api_key="sesame"))
    for path in ("/get_model_info", "/health_generate", "/flush_cache"):
        status, error = _call(url, path, method="GET")
        assert status == 401 and error["error"]["code"] == "missing_api_key", path
