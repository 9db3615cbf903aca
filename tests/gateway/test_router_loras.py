"""Run-time LoRA through the router: a load or unload reaches every replica, a failure on one
names it and leaves the replicas alike, /v1/models lists only what every replica serves, and a
replica that comes up again (restarted) gets the loads the router remembers, not the unloaded
ones, before it takes traffic. The replicas are fake-runner engines in this process, each
runner a ParamsRecorder (what a request ran on); the router's health checks run when a test
says (`_check_health`), never on a clock."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from troupe.gateway.responses_store import new_home_id
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.router_harness import LoopThread, RouterThread
from tests.gateway.scripted_runner import ParamsRecorder

CONFIG = BASE_CONFIG.replace(enable_lora=True)
ALLOW = GatewaySettings(engine_process=False, allow_runtime_lora_updating=True)
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"

MakeRouter = Callable[[list[ServerThread | str]], RouterThread]


def _replica(config: Any, settings: GatewaySettings) -> ServerThread:
    return ServerThread(config, settings, runner=ParamsRecorder(FakeRunner.from_config(config)))


@pytest.fixture(scope="module")
def replicas() -> Iterator[dict[str, ServerThread]]:
    """a, b: LoRA on, run-time updates allowed; no_updates: without the gateway setting (the
    paths are 404); no_lora: an engine without enable_lora (a load is a 400)."""
    started = {
        "a": _replica(CONFIG, ALLOW).start(),
        "b": _replica(CONFIG, ALLOW).start(),
        "no_updates": _replica(CONFIG, GatewaySettings(engine_process=False)).start(),
        "no_lora": _replica(BASE_CONFIG, ALLOW).start(),
    }
    yield started
    for srv in started.values():
        srv.shutdown()


@pytest.fixture(autouse=True)
def _no_adapters_left(replicas: dict[str, ServerThread]) -> Iterator[None]:
    yield
    for srv in (replicas["a"], replicas["b"]):
        for name in list(srv.engine.lora_adapters):
            assert _request(srv.url, UNLOAD, {"lora_name": name})[0] == 200


@pytest.fixture
def make_router() -> Iterator[MakeRouter]:
    routers: list[RouterThread] = []

    def make(backends: list[ServerThread | str]) -> RouterThread:
        urls = tuple(b if isinstance(b, str) else b.url for b in backends)
        settings = RouterSettings(backend_urls=urls, health_check_interval_s=3600.0)
        routers.append(RouterThread().start_router(settings))
        return routers[-1]

    yield make
    for router in routers:
        router.close()


def _request(url: str, path: str, body: object = None) -> tuple[int, dict[str, str], Any]:
    """(status, headers, the body: JSON decoded, or text)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            status, headers, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers), exc.read()
    is_json = headers.get("Content-Type", "").startswith("application/json")
    return status, headers, json.loads(raw) if is_json else raw.decode()


def _load(url: str, name: str, path: str) -> tuple[int, dict[str, str], Any]:
    return _request(url, LOAD, {"lora_name": name, "lora_path": path})


def _unload(url: str, name: str) -> tuple[int, dict[str, str], Any]:
    return _request(url, UNLOAD, {"lora_name": name})


def _model_ids(url: str) -> list[str]:
    status, _, body = _request(url, "/v1/models")
    assert status == 200, body
    return [m["id"] for m in body["data"]]


def _check_health(router: RouterThread) -> None:
    """One round of the router's health checks, now (its own loop waits an hour)."""

    async def check() -> None:
        assert router.replicas is not None
        async with aiohttp.ClientSession() as session:
            await router.replicas.check_all(session)

    router.call(check())


def _mark_down(router: RouterThread, index: int) -> None:
    """Replica `index` down, as a failed health check or a refused connection leaves it."""

    async def down() -> None:
        assert router.replicas is not None
        router.replicas.mark(router.replicas.replicas[index], False, "the test says so")

    router.call(down())


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_load_and_unload_reach_every_replica(replicas, make_router: MakeRouter) -> None:  # type: ignore[no-untyped-def]
    a, b = replicas["a"], replicas["b"]
    base = a.engine.model_name
    router = make_router([a, b])

    status, headers, text = _load(router.url, "sql", "/adapters/sql")
    assert (status, text) == (200, "Success: LoRA adapter 'sql' added successfully.")
    assert headers["Content-Type"].startswith("text/plain")
    assert a.engine.lora_adapters == b.engine.lora_adapters == {"sql": "/adapters/sql"}
    assert _model_ids(router.url) == [base, "sql"]

    # unrelated prompts spread over both replicas; each ran its request on the adapter
    reached = set()
    for prompt in ("SELECT name FROM users", "-- orders shipped this week"):
        body = {"model": "sql", "prompt": prompt, "max_tokens": 2}
        status, headers, answer = _request(router.url, "/v1/completions", body)
        assert status == 200 and answer["model"] == "sql", answer
        srv = (a, b)[int(headers["X-Troupe-Replica"])]
        assert [p.lora for p in srv.runner.take(answer["id"])] == ["sql"]
        reached.add(srv.url)
    assert reached == {a.url, b.url}

    status, _, text = _unload(router.url, "sql")
    assert (status, text) == (200, "Success: LoRA adapter 'sql' removed successfully.")
    assert a.engine.lora_adapters == b.engine.lora_adapters == {}
    assert _model_ids(router.url) == [base]
    body = {"model": "sql", "prompt": "SELECT", "max_tokens": 2}
    status, _, answer = _request(router.url, "/v1/completions", body)
    assert status == 404 and answer["error"]["code"] == "model_not_found", answer


@pytest.mark.parametrize(
    ("other", "status", "code", "needle"),
    [
        ("no_updates", 404, "replica_failed", "answered 404"),  # the path is unknown there
        ("no_lora", 400, "lora_disabled", "enable_lora"),
    ],
)
def test_a_load_that_fails_on_one_replica_is_undone_on_the_others(  # type: ignore[no-untyped-def]
    replicas, make_router: MakeRouter, other: str, status: int, code: str, needle: str
) -> None:
    a, failing = replicas["a"], replicas[other]
    router = make_router([a, failing])

    got, _, answer = _load(router.url, "sql", "/adapters/sql")
    assert got == status and answer["error"]["code"] == code, answer
    message = answer["error"]["message"]
    assert f"failed on 1 of 2 replicas: {failing.url} answered {status}" in message, message
    assert needle in message
    assert f"succeeded on {a.url}; unloaded it again from {a.url}" in message, message
    assert "best effort" in message
    assert a.engine.lora_adapters == {}  # the replicas stay alike
    assert _model_ids(router.url) == [a.engine.model_name]
    assert router.replicas is not None and router.replicas.loras.names == ()  # not replayed


def test_a_down_replica_counts_as_failed(replicas, make_router: MakeRouter) -> None:  # type: ignore[no-untyped-def]
    a, dead = replicas["a"], _dead_url()
    router = make_router([a, dead])

    status, _, answer = _load(router.url, "sql", "/adapters/sql")
    assert status == 503 and answer["error"]["code"] == "replica_failed", answer
    message = answer["error"]["message"]
    assert f"{dead} is down: not sent (counted as 503)" in message, message
    assert f"unloaded it again from {a.url}" in message, message
    assert a.engine.lora_adapters == {}
    assert _model_ids(router.url) == [a.engine.model_name]  # the up replica's


def test_an_unload_that_fails_on_one_replica_names_it(replicas, make_router: MakeRouter) -> None:  # type: ignore[no-untyped-def]
    a, b = replicas["a"], replicas["b"]
    assert _load(a.url, "only-a", "/adapters/only-a")[0] == 200  # straight to one replica
    router = make_router([a, b])

    status, _, answer = _unload(router.url, "only-a")
    assert status == 404, answer
    assert (answer["error"]["param"], answer["error"]["code"]) == (
        "lora_name",
        "lora_adapter_not_found",
    )
    message = answer["error"]["message"]
    assert f"{b.url} answered 404: no LoRA adapter named 'only-a' is loaded" in message
    assert f"succeeded on {a.url}" in message, message
    assert a.engine.lora_adapters == {}


def test_models_lists_only_what_every_replica_serves(replicas, make_router: MakeRouter) -> None:  # type: ignore[no-untyped-def]
    a, b = replicas["a"], replicas["b"]
    base = a.engine.model_name
    for srv, name in ((a, "only-a"), (a, "both"), (b, "both"), (b, "only-b")):
        assert _load(srv.url, name, f"/adapters/{name}")[0] == 200
    assert _model_ids(a.url) == [base, "only-a", "both"]

    router = make_router([a, b])
    status, _, body = _request(router.url, "/v1/models")
    assert status == 200 and body["object"] == "list", body
    assert [(m["id"], m["root"], m["parent"]) for m in body["data"]] == [
        (base, base, None),
        ("both", "/adapters/both", base),
    ]


def test_a_replica_that_comes_up_again_gets_the_run_time_loads(  # type: ignore[no-untyped-def]
    replicas, make_router: MakeRouter
) -> None:
    a, b = replicas["a"], replicas["b"]
    base = a.engine.model_name
    router = make_router([a, b])
    loaded = {"sql": "/adapters/sql", "math": "/adapters/math"}
    for name, path in loaded.items():
        assert _load(router.url, name, path)[0] == 200

    # down, then up again having kept them (it was only unreachable): lora_adapter_exists is
    # as good as loaded
    _mark_down(router, 1)
    _check_health(router)
    assert [r["up"] for r in router.stats()] == [True, True]
    assert b.engine.lora_adapters == loaded

    # restarted while down: back with none of them, and given them before it is up again
    for name in loaded:
        assert _unload(b.url, name)[0] == 200
    _mark_down(router, 1)
    _check_health(router)
    assert [r["up"] for r in router.stats()] == [True, True]
    assert b.engine.lora_adapters == loaded
    assert _model_ids(router.url) == [base, "sql", "math"]

    # restarted between two checks, seen up all along: its new home id tells
    for name in loaded:
        assert _unload(b.url, name)[0] == 200
    assert _model_ids(router.url) == [base]
    b.gateway.home_id = new_home_id()
    _check_health(router)
    assert b.engine.lora_adapters == loaded
    assert _model_ids(router.url) == [base, "sql", "math"]


def test_an_unloaded_adapter_is_not_replayed(replicas, make_router: MakeRouter) -> None:  # type: ignore[no-untyped-def]
    a, b = replicas["a"], replicas["b"]
    router = make_router([a, b])
    for name in ("sql", "math"):
        assert _load(router.url, name, f"/adapters/{name}")[0] == 200
    assert _unload(router.url, "sql")[0] == 200
    assert router.replicas is not None and router.replicas.loras.names == ("math",)

    assert _unload(b.url, "math")[0] == 200  # b restarts: back with no adapter
    _mark_down(router, 1)
    _check_health(router)
    assert b.engine.lora_adapters == {"math": "/adapters/math"}
    assert _model_ids(router.url) == [a.engine.model_name, "math"]


def test_a_replica_that_fails_the_replay_stays_down(replicas, make_router: MakeRouter) -> None:  # type: ignore[no-untyped-def]
    """A stand-in replica whose /health says 200 answers each load with the next status of
    `answers`, noting whether the router had it up then."""
    answers, was_up = [200, 503, 200], []
    holder: list[RouterThread] = []

    async def load(request: web.Request) -> web.Response:
        assert holder[0].replicas is not None
        was_up.append(holder[0].replicas.replicas[1].is_up)
        return web.Response(status=answers.pop(0), text="Success")

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post(LOAD, load)
    app.router.add_get("/health", health)
    stand_in = LoopThread()
    try:
        router = make_router([replicas["a"], stand_in.add_app(app)])
        holder.append(router)
        assert _load(router.url, "sql", "/adapters/sql")[0] == 200
        _mark_down(router, 1)
        _check_health(router)  # the replay meets a 503: not up
        assert [r["up"] for r in router.stats()] == [True, False]
        _check_health(router)  # the next check replays again
        assert [r["up"] for r in router.stats()] == [True, True]
        assert was_up == [True, False, False] and answers == []  # no traffic before the loads
    finally:
        stand_in.close()
