"""A client going away is routine: its requests are aborted, nothing is logged above debug,
no traceback, and no gateway task is left behind (pending, or destroyed while pending)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import pathlib

import anyio
import pytest
import structlog
import troupe.gateway
from websockets.asyncio.client import connect

from tests.gateway.conftest import open_post

pytestmark = pytest.mark.anyio

HANG = 60  # s: a hang detector only
_GATEWAY_DIR = pathlib.Path(troupe.gateway.__file__).parent
LONG = {"prompt": "x", "max_tokens": 900, "ignore_eos": True}


def _gateway_tasks() -> list[str]:
    """Names of the gateway's own tasks still alive on the server's loop (called there)."""
    names = []
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        if code is not None and pathlib.Path(code.co_filename).parent == _GATEWAY_DIR:
            if code.co_qualname != "RemoteEngine.wait_stopped":  # serve()'s, for the server's life
                names.append(code.co_qualname)
    return names


async def _settled(server) -> None:  # type: ignore[no-untyped-def]
    """Until the engine is idle and no gateway task is left; then collect garbage there."""
    await asyncio.to_thread(server.wait_idle)

    async def left() -> list[str]:
        gc.collect()  # a task destroyed while pending is reported here, by asyncio's logger
        return _gateway_tasks()

    with anyio.fail_after(HANG):
        while server.call(left()):
            await asyncio.sleep(0.01)


async def test_vanishing_clients_are_routine(server, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO)
    ws_url = server.url.replace("http://", "ws://") + "/v1/ws"
    with structlog.testing.capture_logs() as logs:
        # SSE: the socket is closed after the first chunk.
        sock = open_post(server.url, "/v1/completions", {**LONG, "stream": True})
        sock.recv(1)
        sock.close()
        await _settled(server)
        # A whole (non-streamed) answer: the client hangs up while it is computed.
        sock = open_post(server.url, "/v1/completions", LONG)
        with anyio.fail_after(HANG):
            while server.engine.num_active == 0:
                await asyncio.sleep(0.01)
        sock.close()
        await _settled(server)
        # Websocket: a clean close, then a TCP reset, each with requests in flight.
        for abrupt in (False, True):
            ws = await connect(ws_url)
            for i in range(3):
                frame = {"type": "generate", "request_id": f"r{i}", **LONG}
                await ws.send(json.dumps(frame))
            assert json.loads(await ws.recv())["type"] == "delta"
            if abrupt:
                ws.transport.abort()
            else:
                await ws.close()
            await _settled(server)
    loud = [e for e in logs if e["log_level"] not in ("debug", "info") or "exc_info" in e]
    assert loud == [], loud
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]
