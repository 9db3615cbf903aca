"""`troupe serve` with its engine in a child process: the gateway's behaviours hold across the
process boundary. (The shared `server` fixture runs this way too, so every gateway test that
uses it exercises the child; these tests add what needs a child of one's own.)"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
from typing import Any

import aiohttp
import pytest
from troupe.actors.engine import EngineStopped
from troupe.gateway.remote_engine import RemoteEngine

from tests.gateway.conftest import BASE_CONFIG
from tests.gateway.engine_process_faults import ChildRunnerGate

pytestmark = pytest.mark.anyio

HANG = 30  # s: a hang detector only
LONG = {"prompt": "tell me everything", "max_tokens": 1000, "ignore_eos": True, "stream": True}


async def _sse_lines(resp: aiohttp.ClientResponse, lines: list[str]) -> list[str]:
    async for raw in resp.content:
        if raw.strip():
            lines.append(raw.decode().strip())
    return lines


async def test_the_shared_server_runs_its_engine_in_a_child(server) -> None:  # type: ignore[no-untyped-def]
    engine = server.engine
    assert isinstance(engine, RemoteEngine)
    assert engine.pid not in (0, os.getpid())
    async with aiohttp.ClientSession() as http:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            lines = await _sse_lines(resp, [])
        body = {**body, "stream": False, "logprobs": True, "top_logprobs": 2}
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            whole = await resp.json()
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert lines[-1] == "data: [DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 4
    # The gateway decodes logprob tokens with its own copy of the tokenizer.
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(item["token"] for item in content)
    assert "".join(item["token"] for item in content) == whole["choices"][0]["message"]["content"]
    await asyncio.to_thread(server.wait_idle)


async def test_the_gateway_freezes_its_start_up_heap(make_server) -> None:  # type: ignore[no-untyped-def]
    """With the engine in a child, only the gateway can freeze this process's heap: its
    start-up objects stay out of full collections while it serves (a burst's arrivals
    otherwise queue behind collector pauses), and the heap is unfrozen when it stops."""
    before = gc.get_freeze_count()
    srv = make_server(BASE_CONFIG.replace(gc_freeze=True))
    assert isinstance(srv.engine, RemoteEngine)
    assert gc.get_freeze_count() > before + 10_000
    await asyncio.to_thread(srv.shutdown)
    assert gc.get_freeze_count() == before


async def test_a_websocket_cancel_aborts_in_the_child(make_server) -> None:  # type: ignore[no-untyped-def]
    gate = ChildRunnerGate(hang_at_step=3)
    srv = make_server(runner_factory=gate.factory)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{srv.url}/v1/ws") as ws:
                frame = {"type": "generate", "request_id": "r1", "prompt": "x", "max_tokens": 1000}
                await ws.send_json({**frame, "ignore_eos": True})
                first = await ws.receive_json(timeout=HANG)
                assert (first["type"], first["request_id"]) == ("delta", "r1")
                assert await asyncio.to_thread(gate.wait_until_held, HANG)
                # Still held: the request cannot finish, so only the cancel can end it.
                await ws.send_json({"type": "cancel", "request_id": "r1"})
                frames = [first]
                while frames[-1]["type"] == "delta":
                    frames.append(await ws.receive_json(timeout=HANG))
        done = frames[-1]
        assert (done["type"], done["finish_reason"]) == ("done", "abort")
        assert done["usage"]["completion_tokens"] < LONG["max_tokens"]
        gate.release()  # the held step returns; then the aborted request's blocks are freed
        await asyncio.to_thread(srv.wait_idle)
        assert srv.engine.stats().num_gpu_blocks_used == 0
    finally:
        gate.release()


async def test_shutdown_drains_then_aborts_in_the_child(make_server) -> None:  # type: ignore[no-untyped-def]
    gate = ChildRunnerGate(hang_at_step=3)
    srv = make_server(runner_factory=gate.factory, shutdown_grace=0.5)
    pid = srv.engine.pid
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{srv.url}/v1/completions", json=LONG) as resp:
                lines = [(await resp.content.readline()).decode().strip()]
                assert await asyncio.to_thread(gate.wait_until_held, HANG)
                srv.begin_shutdown()  # what SIGTERM does
                async with asyncio.timeout(HANG):
                    while True:
                        async with http.get(f"{srv.url}/health") as health:
                            if health.status == 503:
                                assert (await health.json())["status"] == "draining"
                                break
                        await asyncio.sleep(0.01)
                async with http.post(f"{srv.url}/v1/completions", json={"prompt": "x"}) as late:
                    assert late.status == 503
                await _sse_lines(resp, lines)  # held past the grace: aborted in the child
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2].removeprefix("data: "))["error"]
        assert error["code"] == "aborted" and "shutting down" in error["message"]
        gate.release()  # the child's engine closes once its held step returns
        await asyncio.to_thread(srv.join, HANG)  # both processes stopped, without an error
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the child is gone (and reaped)
    finally:
        gate.release()


async def test_a_dead_child_fails_open_streams_and_stops_serve(make_server) -> None:  # type: ignore[no-untyped-def]
    gate = ChildRunnerGate(hang_at_step=3)
    srv = make_server(runner_factory=gate.factory)
    engine: Any = srv.engine
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{srv.url}/v1/completions", json=LONG) as resp:
            lines = [(await resp.content.readline()).decode().strip()]
            assert await asyncio.to_thread(gate.wait_until_held, HANG)
            os.kill(engine.pid, signal.SIGKILL)
            await _sse_lines(resp, lines)
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["code"] == "internal_error"
    assert "engine failure: the engine process exited unexpectedly" in error["message"]
    assert not engine.is_healthy  # /health answers 503 from here on (test_engine_failure.py)
    assert engine.failure == "engine failure: the engine process exited unexpectedly"
    stats = engine.stats()  # the pools went with the child: declared gone
    assert (stats.num_gpu_blocks, stats.num_gpu_blocks_used, stats.num_running) == (0, 0, 0)
    with pytest.raises(RuntimeError) as info:
        await asyncio.to_thread(srv.join, HANG)  # serve() returned by itself, with an error
    assert isinstance(info.value.__cause__, EngineStopped)
    assert "exit code -9" in str(info.value.__cause__)
