"""One bad frame never stops the engine; an engine that does stop says so and exits non-zero."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
from typing import Any, ClassVar

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from troupe.actors.engine import Engine, EngineStopped
from troupe.config import EngineConfig
from troupe.gateway import server as server_module
from troupe.gateway.app import build_app
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner
from troupe.messages import EngineStats, Failed
from websockets.asyncio.client import connect

from tests.gateway.engine_process_faults import dying_fake_runner

pytestmark = pytest.mark.anyio


async def _ws_frames(ws: Any, request_id: str) -> list[dict[str, Any]]:
    frames = []
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("request_id") == request_id:
            frames.append(frame)
            if frame["type"] in ("done", "error"):
                return frames


async def test_an_empty_stop_string_is_an_error_frame_and_the_engine_serves_on(
    server,  # type: ignore[no-untyped-def]
) -> None:
    url = str(server.url).replace("http://", "ws://") + "/v1/ws"
    async with connect(url) as ws:
        bad = {"type": "generate", "request_id": "bad", "prompt": "Hi", "stop": [""]}
        await ws.send(json.dumps(bad))
        frames = await _ws_frames(ws, "bad")
        assert [f["type"] for f in frames] == ["error"]
        assert "stop" in frames[0]["message"]
        good = {"type": "generate", "request_id": "good", "prompt": "Hi", "max_tokens": 3}
        await ws.send(json.dumps(good))
        frames = await _ws_frames(ws, "good")
        assert frames[-1]["type"] == "done" and frames[-1]["finish_reason"] == "length"
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{server.url}/v1/completions", json={"prompt": "Hi", "stop": [""]}
        ) as resp:
            assert resp.status == 400
            assert "stop" in (await resp.json())["error"]["message"]
        async with http.get(f"{server.url}/health") as resp:
            assert resp.status == 200
    assert server.engine.is_healthy


class _DeadEngine:
    """The slice of an engine /health reads, after its graph failed."""

    model_name = "dead"
    max_model_len = 0  # never learnt
    lora_adapters: ClassVar[dict[str, str]] = {}
    is_healthy = False
    failure = "engine dead: tensor-parallel worker failed: rank 1 exited with code -9"

    def stats(self) -> EngineStats:
        return EngineStats()

    def add_event_listener(self, fn: Any) -> None:
        pass


async def test_health_is_503_once_the_engine_failed() -> None:
    runner = web.AppRunner(build_app(_DeadEngine(), GatewaySettings()))  # type: ignore[arg-type]
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{host}:{port}/health") as resp:
                assert resp.status == 503
                body = await resp.json()
                assert body["status"] == "failed" and body["error"] == _DeadEngine.failure
    finally:
        await runner.cleanup()


async def test_serve_stops_with_an_error_when_the_executor_hangs(
    make_server,  # type: ignore[no-untyped-def]
) -> None:
    config = EngineConfig(
        runner="fake", device="cpu", num_kv_blocks=64, num_cpu_blocks=4, step_timeout_s=1.0
    )
    runner = FaultyRunner(FakeRunner.from_config(config), hang_at_step=2)
    srv = make_server(config, runner=runner)
    try:
        async with aiohttp.ClientSession() as http:
            body = {"prompt": "Hi", "max_tokens": 8, "stream": True}
            async with http.post(f"{srv.url}/v1/completions", json=body) as resp:
                lines = [raw.decode().strip() async for raw in resp.content if raw.strip()]
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][len("data: ") :])["error"]
        assert "step_timeout_s" in error["message"]
        with pytest.raises(RuntimeError) as info:
            await asyncio.to_thread(srv.join, 30.0)  # serve() returned by itself, with an error
        assert isinstance(info.value.__cause__, EngineStopped)
    finally:
        runner.release()


def test_run_serve_exits_non_zero_when_the_engine_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def failing_serve(*args: Any, **kwargs: Any) -> None:
        raise EngineStopped("the engine crashed: boom")

    monkeypatch.setattr(server_module, "serve", failing_serve)
    args = argparse.Namespace(
        api_key=None, max_body_bytes=1 << 20, host="127.0.0.1", port=0, shutdown_grace=1.0
    )
    assert server_module.run_serve(args, EngineConfig(runner="fake")) == 1


DEAD = "engine dead: the runner died at step 3 (injected)"


async def test_serve_answers_in_flight_requests_then_exits_when_the_runner_dies(
    make_server,  # type: ignore[no-untyped-def]
) -> None:
    # The engine in its child process, as `troupe serve` runs it: step 3 raises RunnerDead.
    factory = functools.partial(dying_fake_runner, dead_at_step=3)
    srv = make_server(runner_factory=factory)
    async with aiohttp.ClientSession() as http:
        body = {"prompt": "Hi", "max_tokens": 8, "stream": True, "ignore_eos": True}
        async with http.post(f"{srv.url}/v1/completions", json=body) as resp:
            lines = [raw.decode().strip() async for raw in resp.content if raw.strip()]
    assert lines[-1] == "data: [DONE]"  # answered in full before the server went away
    error = json.loads(lines[-2][len("data: ") :])["error"]
    assert error["message"] == f"request failed: {DEAD}"
    assert len(lines) == 4  # the tokens of steps 1 and 2, the error, [DONE]
    with pytest.raises(RuntimeError) as info:
        await asyncio.to_thread(srv.join, 60.0)  # serve() returned by itself, with an error
    assert isinstance(info.value.__cause__, EngineStopped)
    assert str(info.value.__cause__) == DEAD  # what run_serve logs before it exits 1


async def test_an_embedded_dead_engine_answers_503_naming_the_cause() -> None:
    config = EngineConfig(runner="fake", device="cpu", num_kv_blocks=64, num_cpu_blocks=4)
    runner = FaultyRunner(FakeRunner.from_config(config), dead_at_step=3)
    answers: dict[str, Any] = {}
    with pytest.raises(EngineStopped):  # the library user's `async with` says so on leaving
        async with Engine.open(config, runner=runner) as engine:
            params = {"max_tokens": 8, "ignore_eos": True}
            events = [e async for e in engine.generate([5, 6, 7], params)]
            await engine.wait_stopped()
            app = build_app(engine, GatewaySettings())
            async with TestClient(TestServer(app)) as client:
                health = await client.get("/health")
                answers["health"] = (health.status, await health.json())
                body = {"model": engine.model_name, "prompt": "Hi", "max_tokens": 2}
                late = await client.post("/v1/completions", json=body)
                answers["late"] = (late.status, await late.json())
    assert isinstance(events[-1], Failed) and events[-1].message == DEAD
    assert answers["health"] == (503, {"status": "failed", "error": DEAD})
    status, late_body = answers["late"]
    assert status == 503 and late_body["error"]["message"] == DEAD
