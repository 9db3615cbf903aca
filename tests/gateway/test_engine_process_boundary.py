"""What must cross the gateway / engine-process boundary: a client that hangs up aborts its
request in the child; a child that dies ends every open request with exactly one terminal
event, fails /health, shows on /metrics, and leaves no process behind. Each test holds a step
of the child's runner (ChildRunnerGate), so the requests are certain to be in flight."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from troupe.actors.engine import EngineStopped
from troupe.gateway.app import build_app
from troupe.gateway.engine_launch import open_remote_engine
from troupe.gateway.server import listen
from troupe.gateway.state import GatewaySettings
from troupe.messages import Failed, RejectCode, Rejected, StreamEvent

from tests.gateway.conftest import BASE_CONFIG
from tests.gateway.engine_process_faults import ChildRunnerGate

pytestmark = pytest.mark.anyio

HANG = 30  # s: a hang detector only
PARAMS = {"max_tokens": 1000, "ignore_eos": True}
LONG = {"prompt": "x", **PARAMS}


async def _outcomes(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """troupe_requests_total by outcome, from /metrics."""
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "troupe_requests_total"
    }


async def test_a_client_that_hangs_up_aborts_its_request_in_the_child(make_server) -> None:  # type: ignore[no-untyped-def]
    gate = ChildRunnerGate(hang_at_step=3)
    srv = make_server(runner_factory=gate.factory)
    try:
        async with aiohttp.ClientSession() as http:
            before = await _outcomes(http, srv.url)
            resp = await http.post(f"{srv.url}/v1/completions", json={**LONG, "stream": True})
            assert (await resp.content.readline()).startswith(b"data: ")
            assert await asyncio.to_thread(gate.wait_until_held, HANG)
            resp.close()  # hang up while the child's step is held: the request cannot finish
            async with asyncio.timeout(HANG):
                while srv.engine.num_active:  # the gateway closed its stream, sent the abort
                    await asyncio.sleep(0.01)
            gate.release()
            async with asyncio.timeout(HANG):
                while True:  # until the request's outcome is counted, whatever it is
                    after = await _outcomes(http, srv.url)
                    if after["aborted"] + after["length"] > before["aborted"] + before["length"]:
                        break
                    await asyncio.sleep(0.01)
        # Had the abort not reached the child, the request would have run to max_tokens.
        assert (after["aborted"], after["length"]) == (before["aborted"] + 1, before["length"])
        await asyncio.to_thread(srv.wait_idle)  # and its blocks came back
    finally:
        gate.release()


async def _collect(events: list[StreamEvent], stream: object) -> None:
    async for event in stream:  # type: ignore[attr-defined]
        events.append(event)


async def test_a_killed_engine_process_ends_each_request_once() -> None:
    gate = ChildRunnerGate(hang_at_step=3)
    settings = GatewaySettings()
    pid = 0
    streams: list[list[StreamEvent]] = [[], [], []]
    lines: list[str] = []
    outcomes: dict[str, float] = {}
    late: list[StreamEvent] = []
    with pytest.raises(EngineStopped, match="exit code -9"):
        async with open_remote_engine(BASE_CONFIG, runner_factory=gate.factory) as engine:
            pid = engine.pid
            app_runner = await listen(build_app(engine, settings), settings, "127.0.0.1", 0)
            host, port = app_runner.addresses[0][:2]
            url = f"http://{host}:{port}"
            try:
                async with aiohttp.ClientSession() as http:
                    body = {**LONG, "stream": True}
                    resp = await http.post(f"{url}/v1/completions", json=body)
                    lines.append((await resp.content.readline()).decode().strip())
                    readers = [
                        asyncio.create_task(_collect(events, engine.generate("x", PARAMS)))
                        for events in streams
                    ]
                    assert await asyncio.to_thread(gate.wait_until_held, HANG)
                    async with asyncio.timeout(HANG):
                        while engine.num_active < 4:  # every stream is open
                            await asyncio.sleep(0.01)
                    os.kill(pid, signal.SIGKILL)
                    async with asyncio.timeout(HANG):
                        await asyncio.gather(*readers)
                        lines += [raw.decode().strip() async for raw in resp.content]
                    async with http.get(f"{url}/health") as health:
                        assert health.status == 503
                        assert (await health.json())["status"] == "failed"
                    outcomes = await _outcomes(http, url)
                late = [event async for event in engine.generate("x", PARAMS)]
            finally:
                await app_runner.cleanup()
    # checked here, not inside: leaving the engine raises EngineStopped, which would hide them
    for events in streams:
        assert sum(event.is_terminal for event in events) == 1
        assert isinstance(events[-1], Failed)
        assert "exited unexpectedly" in events[-1].message
    sse = [line for line in lines if line]
    assert sse[-1] == "data: [DONE]"
    assert sum('"error"' in line for line in sse) == 1
    assert "exited unexpectedly" in sse[-2]
    assert outcomes["failed"] == 4  # the three streams and the HTTP request
    assert len(late) == 1 and isinstance(late[0], Rejected)
    assert late[0].code == RejectCode.SHUTTING_DOWN
    assert pid != 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: no orphan, no zombie
