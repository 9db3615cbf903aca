"""Outbox and pump: a slow reader is cut off with Overflow, and the engine stream is closed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from troupe.gateway.outbox import Outbox, Overflow
from troupe.gateway.pump import pump
from troupe.messages import Delta, Finished, FinishReason, StreamEvent, Timings, Usage

pytestmark = pytest.mark.anyio


def test_outbox_limits_frames_and_bytes() -> None:
    box = Outbox(max_frames=3, max_bytes=10)
    box.put("abc")
    box.put("defg")
    assert (len(box), box.num_bytes) == (2, 7)
    with pytest.raises(Overflow, match="2 frames \\(7 bytes\\) unread"):
        box.put("hijk")  # 11 bytes > 10
    assert (len(box), box.num_bytes) == (0, 0)  # dropped: the reader is cut off
    with pytest.raises(Overflow):
        box.put("x")  # stays overflowed


async def test_outbox_drains_then_ends() -> None:
    box = Outbox(max_frames=2, max_bytes=100)
    box.put("a")
    box.put("b")
    box.close()
    assert [await box.get(), await box.get(), await box.get()] == ["a", "b", None]


async def test_outbox_hands_out_everything_queued_at_once() -> None:
    box = Outbox(max_frames=3, max_bytes=100)
    box.put("a")
    box.put("bc")
    assert await box.get_all() == ["a", "bc"]
    assert (len(box), box.num_bytes) == (0, 0)  # room again for the next frames
    box.put("d")
    box.close()
    assert [await box.get_all(), await box.get_all()] == [["d"], []]


def _delta(i: int) -> Delta:
    return Delta(request_id="r", text=f"t{i}", token_ids=(i,))


async def test_pump_cuts_off_a_reader_that_never_reads() -> None:
    produced: list[int] = []
    closed = False

    async def events() -> AsyncIterator[StreamEvent]:
        nonlocal closed
        try:
            for i in range(1000):
                produced.append(i)
                yield _delta(i)
        finally:
            closed = True  # the engine aborts the request when its stream is closed

    box = Outbox(max_frames=8, max_bytes=1 << 20)
    with pytest.raises(Overflow):
        await pump(events(), box, lambda e: [e.text])
    assert len(produced) == 9  # the 9th frame broke the 8-frame limit; nothing more was pulled
    assert closed


async def test_pump_returns_the_terminal_event() -> None:
    finished = Finished(
        request_id="r",
        text="!",
        token_ids=(9,),
        finish_reason=FinishReason.STOP,
        usage=Usage(prompt_tokens=3, completion_tokens=3),
        timings=Timings(ttft=0.1, tpot=0.01, e2e=0.2),
    )

    async def events() -> AsyncIterator[StreamEvent]:
        yield _delta(1)
        yield finished
        raise AssertionError("read past the terminal event")

    box = Outbox(max_frames=8, max_bytes=1 << 20)
    assert await pump(events(), box, lambda e: [e.text], first=_delta(0)) is finished
    box.close()
    assert [await box.get() for _ in range(4)] == ["t0", "t1", "!", None]
