"""A websocket cancel wins whenever it arrives before the request's terminal event.

A scripted engine models the real one's ordering hazard: an abort for a request id the engine
has not received yet is dropped. Each test holds the request at one point of its life, sends
the cancel there, and checks that the request ends aborted instead of running to max_tokens.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import anyio
import pytest
from troupe.gateway.state import Gateway, GatewaySettings
from troupe.gateway.websocket import WsSession
from troupe.messages import (
    Aborted,
    Delta,
    EngineStats,
    Finished,
    FinishReason,
    StreamEvent,
    Timings,
    Usage,
)
from troupe.messages.sampling_defaults import NO_DEFAULTS
from websockets.asyncio.client import connect

pytestmark = pytest.mark.anyio

MAX_TOKENS = 1000
HANG = 60  # s: a hang detector only


class ScriptedEngine:
    """Streams one token per step once `admit` is set; honours aborts for received ids only."""

    model_name = "scripted"
    lora_adapters: ClassVar[dict[str, str]] = {}
    max_model_len = 1 << 20
    sampling_defaults = NO_DEFAULTS
    tokenizer = None
    is_healthy = True

    def __init__(self, *, receive_late: bool = False) -> None:
        self.receive_late = receive_late  # received only once admitted (the racy window)
        self.admit = asyncio.Event()
        self.started = asyncio.Event()  # a generate stream has begun
        self.received: set[str] = set()
        self.aborted: set[str] = set()
        self.dropped_aborts: list[str] = []
        self.num_open = 0

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
        await asyncio.Event().wait()

    async def abort(self, request_id: str, reason: str = "aborted") -> None:
        if request_id in self.received:
            self.aborted.add(request_id)
        else:
            self.dropped_aborts.append(request_id)

    async def generate(
        self, prompt: Any, params: Any, *, request_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        assert request_id is not None
        self.num_open += 1
        try:
            if not self.receive_late:
                self.received.add(request_id)
            self.started.set()
            await self.admit.wait()
            self.received.add(request_id)
            timings = Timings(ttft=None, tpot=None, e2e=0.0)
            for i in range(params.max_tokens):
                if request_id in self.aborted:
                    usage = Usage(prompt_tokens=3, completion_tokens=i)
                    yield Aborted(request_id=request_id, reason="x", usage=usage, timings=timings)
                    return
                yield Delta(request_id=request_id, text="t", token_ids=(i,))
                await asyncio.sleep(0)  # a step boundary: lets the abort in
            usage = Usage(prompt_tokens=3, completion_tokens=params.max_tokens)
            yield Finished(
                request_id=request_id,
                text="",
                token_ids=(),
                finish_reason=FinishReason.LENGTH,
                usage=usage,
                timings=timings,
            )
        finally:
            self.num_open -= 1


def _session(engine: ScriptedEngine) -> WsSession:
    # The socket is not used by the frame handling under test.
    return WsSession(None, None, Gateway(engine, GatewaySettings()))  # type: ignore[arg-type]


def _frame(kind: str) -> str:
    if kind == "cancel":
        return json.dumps({"type": "cancel", "request_id": "r"})
    return json.dumps(
        {"type": "generate", "request_id": "r", "prompt": "x", "max_tokens": MAX_TOKENS}
    )


async def _frames_until_idle(session: WsSession) -> list[dict[str, Any]]:
    with anyio.fail_after(HANG):
        while session.requests:
            await asyncio.gather(*list(session._tasks), return_exceptions=True)
        session.outbox.close()
        frames = []
        while (frame := await session.outbox.get()) is not None:
            frames.append(json.loads(frame))
    return frames


async def test_cancel_in_the_same_read_as_its_generate() -> None:
    engine = ScriptedEngine()
    engine.admit.set()
    session = _session(engine)
    session._on_text(_frame("generate"))
    session._on_text(_frame("cancel"))  # before the request's task has run at all
    frames = await _frames_until_idle(session)
    assert [(f["type"], f.get("finish_reason")) for f in frames] == [("done", "abort")]
    assert frames[0]["usage"]["completion_tokens"] == 0
    assert engine.received == set()  # never reached the engine


async def test_cancel_before_the_first_event() -> None:
    engine = ScriptedEngine()
    session = _session(engine)
    session._on_text(_frame("generate"))
    with anyio.fail_after(HANG):
        await engine.started.wait()
    session._on_text(_frame("cancel"))
    engine.admit.set()
    frames = await _frames_until_idle(session)
    assert (frames[-1]["type"], frames[-1]["finish_reason"]) == ("done", "abort")
    assert frames[-1]["usage"]["prompt_tokens"] == 3  # the engine's own Aborted event
    assert engine.dropped_aborts == []


async def test_an_abort_that_overtook_its_request_is_sent_again() -> None:
    """The engine had not received the request when the cancel came: the first abort is lost,
    the one sent at the first event (proof that the engine holds the request) is not."""
    engine = ScriptedEngine(receive_late=True)
    session = _session(engine)
    session._on_text(_frame("generate"))
    with anyio.fail_after(HANG):
        await engine.started.wait()
    session._on_text(_frame("cancel"))
    with anyio.fail_after(HANG):
        while not engine.dropped_aborts:
            await asyncio.sleep(0)  # the abort task runs on the next turns of the loop
    engine.admit.set()
    frames = await _frames_until_idle(session)
    assert (frames[-1]["type"], frames[-1]["finish_reason"]) == ("done", "abort")
    assert sum(f["type"] == "delta" for f in frames) < MAX_TOKENS
    assert len(engine.dropped_aborts) == 1


async def test_cancel_right_after_generate_on_a_real_engine(server) -> None:  # type: ignore[no-untyped-def]
    url = server.url.replace("http://", "ws://") + "/v1/ws"
    generate = {"type": "generate", "request_id": "c", "prompt": "Go", "max_tokens": 900,
                "ignore_eos": True}  # fmt: skip
    async with connect(url) as ws:
        for _ in range(5):
            await ws.send(json.dumps(generate))
            await ws.send(json.dumps({"type": "cancel", "request_id": "c"}))
            with anyio.fail_after(HANG):
                while (frame := json.loads(await ws.recv()))["type"] == "delta":
                    pass
            assert (frame["type"], frame["finish_reason"]) == ("done", "abort"), frame
            assert frame["usage"]["completion_tokens"] < 900
    await asyncio.to_thread(server.wait_idle)
