"""Sleep mode over HTTP (gateway/sleep_routes.py: vLLM's POST /sleep?level=, POST /wake_up?tags=,
GET /is_sleeping), with the engine in this process and in a child (SleepEngine / WakeEngine /
EngineCallReply), and through the router (every replica): the sleeping state as each call
leaves it, /health 200 while asleep, refusals naming the level, the tag and the flag."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.fake_sleep import SleepyFakeRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.router_harness import RouterThread

SLEEPY = BASE_CONFIG.replace(enable_sleep_mode=True)


def _call(url: str, path: str, method: str = "POST") -> tuple[int, Any]:
    data = b"" if method == "POST" else None
    request = urllib.request.Request(f"{url}{path}", data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _sleepy_server() -> ServerThread:
    runner = SleepyFakeRunner(FakeRunner.from_config(SLEEPY))
    return ServerThread(SLEEPY, GatewaySettings(), runner=runner).start()


@pytest.fixture(params=["in_process", "child"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    if request.param == "in_process":
        srv = _sleepy_server()
    else:
        srv = ServerThread(SLEEPY, GatewaySettings()).start()  # the child builds its runner
    yield srv
    srv.shutdown()


def _complete(url: str) -> int:
    body = json.dumps({"prompt": [1, 2, 3, 4, 5], "max_tokens": 3, "ignore_eos": True}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])


def test_sleep_and_wake_up_over_http(server: ServerThread) -> None:
    url = server.url
    assert _complete(url) == 3
    assert _call(url, "/is_sleeping", "GET") == (200, {"is_sleeping": False})
    status, answer = _call(url, "/sleep?level=1")
    assert status == 200 and answer["success"] and answer["is_sleeping"], answer
    assert answer["level"] == 1 and "asleep" in answer["message"]
    assert _call(url, "/is_sleeping", "GET") == (200, {"is_sleeping": True})
    assert _call(url, "/health", "GET")[0] == 200
    status, answer = _call(url, "/sleep?level=one")
    assert status == 400 and "level" in answer["error"]["message"]
    status, answer = _call(url, "/wake_up?tags=weights&tags=optimizer")
    assert status == 400 and "'optimizer'" in answer["message"] and answer["is_sleeping"]
    status, answer = _call(url, "/wake_up?tags=weights")
    assert status == 200 and answer["is_sleeping"], answer  # the KV cache still sleeps
    assert _call(url, "/is_sleeping", "GET") == (200, {"is_sleeping": True})
    status, answer = _call(url, "/wake_up?tags=kv_cache")
    assert status == 200 and not answer["is_sleeping"], answer
    assert _call(url, "/is_sleeping", "GET") == (200, {"is_sleeping": False})
    assert _complete(url) == 3


@pytest.mark.parametrize("where", ["in_process", "child"])
def test_without_the_flag_a_sleep_is_refused_naming_it(where: str) -> None:
    runner = FakeRunner.from_config(BASE_CONFIG) if where == "in_process" else None
    srv = ServerThread(BASE_CONFIG, GatewaySettings(), runner=runner).start()
    try:
        status, answer = _call(srv.url, "/sleep?level=1")
        assert status == 400 and not answer["success"]
        assert (
            "--enable-sleep-mode" in answer["message"] and answer["code"] == "sleep_mode_disabled"
        )
        assert _call(srv.url, "/is_sleeping", "GET") == (200, {"is_sleeping": False})
    finally:
        srv.shutdown()


def test_the_router_puts_every_replica_to_sleep() -> None:
    first, second = _sleepy_server(), _sleepy_server()
    router = RouterThread()
    try:
        urls = (first.url, second.url)
        router.start_router(RouterSettings(backend_urls=urls, health_check_interval_s=3600.0))
        status, answer = _call(router.url, "/sleep?level=2")
        assert status == 200 and answer["replicas"] == 2 and answer["is_sleeping"], answer
        for url in urls:
            assert _call(url, "/is_sleeping", "GET") == (200, {"is_sleeping": True})
        status, answer = _call(router.url, "/is_sleeping", "GET")
        assert status == 200 and answer["is_sleeping"] and set(answer["replicas"]) == set(urls)
        status, answer = _call(router.url, "/wake_up")
        assert status == 200 and not answer["is_sleeping"], answer
        assert _call(router.url, "/is_sleeping", "GET")[1]["is_sleeping"] is False
    finally:
        router.close()
        first.shutdown()
        second.shutdown()
