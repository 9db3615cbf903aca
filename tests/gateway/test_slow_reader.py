"""A reader that stops reading is cut off: its request is aborted and memory stays bounded.

A stand-in engine floods 32 KiB deltas as fast as the gateway takes them, so the kernel's
socket buffers fill within a few hundred events (the fake runner's short tokens would need
minutes). The clients stop reading at once.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import pytest
from aiohttp import web
from troupe.gateway.app import build_app
from troupe.gateway.state import GatewaySettings
from troupe.messages import Delta, EngineStats, StreamEvent
from troupe.messages.sampling_defaults import NO_DEFAULTS
from websockets.asyncio.client import connect

pytestmark = pytest.mark.anyio

CHUNK = "x" * 32 * 1024
SMALL = GatewaySettings(max_buffered_frames=16, max_buffered_bytes=1 << 20, slow_client_grace=0.5)


class FloodEngine:
    """Endless 32 KiB deltas; records how many were taken and whether each stream closed."""

    model_name = "flood"
    lora_adapters: ClassVar[dict[str, str]] = {}
    max_model_len = 1 << 30
    sampling_defaults = NO_DEFAULTS
    tokenizer = None
    is_healthy = True

    def __init__(self) -> None:
        self.num_yielded = 0
        self.num_open = 0
        self.num_closed = 0

    @property
    def num_active(self) -> int:
        return self.num_open

    def stats(self) -> EngineStats:
        return EngineStats()

    def add_event_listener(self, fn: Callable[[StreamEvent, float], None]) -> None:
        pass

    async def abort_all(self, reason: str) -> None:
        pass

    async def wait_stopped(self) -> None:
        await asyncio.Event().wait()  # never stops by itself

    async def generate(
        self, prompt: Any, params: Any, *, request_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        self.num_open += 1
        try:
            while True:
                await asyncio.sleep(0)
                self.num_yielded += 1
                yield Delta(request_id=request_id or "r", text=CHUNK, token_ids=(1,))
        finally:
            self.num_open -= 1
            self.num_closed += 1  # the gateway closed the stream: the engine would abort


async def _serve(engine: FloodEngine) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(build_app(engine, SMALL), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def _until(predicate: Callable[[], bool], timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_stalled_sse_reader_is_cut_off() -> None:
    engine = FloodEngine()
    runner, port = await _serve(engine)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        body = json.dumps({"prompt": "x", "stream": True})
        request = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        )
        await asyncio.get_running_loop().sock_sendall(sock, request.encode())
        await _until(lambda: engine.num_closed == 1, timeout=120)  # aborted, not left running
        # Bounded: the kernel buffers (a few MiB at most) plus the 1 MiB outbox.
        assert engine.num_yielded * len(CHUNK) < 16 * 2**20
        await asyncio.sleep(SMALL.slow_client_grace + 0.3)
        assert runner.server is not None and len(runner.server.connections) == 0  # dropped
    finally:
        sock.close()
        await runner.cleanup()


async def test_stalled_websocket_reader_is_cut_off() -> None:
    engine = FloodEngine()
    runner, port = await _serve(engine)
    try:
        # max_queue=1: the client library stops reading the socket once a frame is unread.
        async with connect(f"ws://127.0.0.1:{port}/v1/ws", max_queue=1, max_size=None) as ws:
            for i in range(2):
                frame = {"type": "generate", "request_id": f"r{i}", "prompt": "x"}
                await ws.send(json.dumps(frame))
            await _until(lambda: engine.num_closed == 2, timeout=120)
            assert engine.num_yielded * len(CHUNK) < 16 * 2**20
            last = None
            with pytest.raises(Exception):  # noqa: B017 (closed with 1008, or dropped)
                while True:
                    last = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert ws.close_code in (1008, 1006)
            if ws.close_code == 1008:  # it read the last frame before the close
                assert last is not None and last["code"] == "slow_consumer"
    finally:
        await runner.cleanup()
