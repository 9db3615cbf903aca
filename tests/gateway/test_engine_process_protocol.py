"""The engine protocol's framing, and the child's EventForwarder: one frame per router batch,
each with its delivery time, and a bounded queue while the gateway does not read."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from troupe.gateway.event_forwarder import EventForwarder
from troupe.messages import (
    Delta,
    EngineStats,
    Failed,
    Finished,
    FinishReason,
    GenerateRequest,
    RejectCode,
    Rejected,
    SamplingParams,
    Timings,
    Usage,
)
from troupe.messages.engine_protocol import (
    EventBatch,
    FrameSplitter,
    Generate,
    Shutdown,
    encode_frame,
    from_engine_decoder,
    to_engine_decoder,
)

pytestmark = pytest.mark.anyio


def _delta(request_id: str, token: int) -> Delta:
    return Delta(request_id=request_id, text=f"t{token}", token_ids=(token,))


def test_frames_survive_any_chunking() -> None:
    request = GenerateRequest(
        request_id="r1",
        params=SamplingParams(max_tokens=7, temperature=0.5, stop=("\n",)),
        arrival_time=12.5,
        prompt_token_ids=(1, 2, 3),
    )
    finished = Finished(
        request_id="r1",
        text="ok",
        token_ids=(9,),
        finish_reason=FinishReason.LENGTH,
        usage=Usage(prompt_tokens=3, completion_tokens=7),
        timings=Timings(ttft=0.1, tpot=0.01, e2e=0.2),
    )
    rejected = Rejected(request_id="r2", code=RejectCode.TOO_LONG, message="long", field="prompt")
    replies = [
        EventBatch(events=(_delta("r1", 5), finished, rejected), stats=EngineStats(), time=3.0),
        EventBatch(events=(), stats=EngineStats(num_running=4), time=4.0),
    ]
    stream = b"".join(encode_frame(reply) for reply in replies)
    for chunk_size in (1, 3, 7, len(stream)):
        splitter = FrameSplitter()
        bodies = []
        for start in range(0, len(stream), chunk_size):
            bodies += splitter.feed(stream[start : start + chunk_size])
        assert [from_engine_decoder.decode(body) for body in bodies] == replies
    commands = [Generate(request=request), Shutdown(grace=1.5)]
    bodies = FrameSplitter().feed(b"".join(encode_frame(c) for c in commands))
    assert [to_engine_decoder.decode(body) for body in bodies] == commands


class _Writer:
    """A socket the gateway reads only when the test lets it (`drain` waits until then)."""

    def __init__(self) -> None:
        self.splitter = FrameSplitter()
        self.batches: list[EventBatch] = []
        self.reading = asyncio.Event()

    def write(self, data: bytes) -> None:
        for body in self.splitter.feed(data):
            reply = from_engine_decoder.decode(body)
            assert isinstance(reply, EventBatch)
            self.batches.append(reply)

    async def drain(self) -> None:
        await self.reading.wait()


async def _let_tasks_run() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_frame_per_router_batch_and_a_bounded_queue() -> None:
    writer = _Writer()
    aborts: list[tuple[str, str]] = []

    def abort(request_id: str, reason: str) -> Coroutine[Any, Any, None]:
        async def record() -> None:
            aborts.append((request_id, reason))

        return record()

    forwarder = EventForwarder(writer, max_pending=3)  # type: ignore[arg-type]
    forwarder.attach(abort)
    # One router batch: its events are put without a yield in between.
    forwarder.on_stats(EngineStats(num_running=2))
    forwarder.put(_delta("a", 1))
    forwarder.put(_delta("b", 1))
    await _let_tasks_run()
    assert [[e.request_id for e in b.events] for b in writer.batches] == [["a", "b"]]
    assert writer.batches[0].stats == EngineStats(num_running=2)
    # The gateway stops reading: later batches queue, one group each; past 3 queued events
    # request "a" is cut off (Failed now, its abort sent, its later events dropped).
    for token in range(2, 7):
        forwarder.put(_delta("a", token))
        if token == 2:
            forwarder.put(_delta("b", token))
        await _let_tasks_run()
    assert len(writer.batches) == 1
    assert aborts == [("a", "stream reader too slow")]
    writer.reading.set()
    await _let_tasks_run()
    sent = [[(e.request_id, e.token_ids) for e in b.events] for b in writer.batches[1:]]
    assert sent == [[("a", (2,)), ("b", (2,))], [("a", (3,))], [("a", (4,))], [("a", ())]]
    cut = writer.batches[-1].events[0]
    assert isinstance(cut, Failed) and "max_stream_buffer" in cut.message
    times = [b.time for b in writer.batches]
    assert times == sorted(times)  # each batch stamped when the router delivered it
    # The engine's own terminal event for "a" ends the cut-off; "b" goes on as before.
    forwarder.put(Failed(request_id="a", message="aborted late"))
    forwarder.put(_delta("b", 3))
    await forwarder.close(timeout=5)
    assert [(e.request_id, e.token_ids) for e in writer.batches[-1].events] == [("b", (3,))]
