"""An actor's batch of messages reaches the next actor as one batch (actors/shell.send_batch):
sent one `await send` at a time, each a checkpoint, a burst crossed every actor boundary one
loop iteration per message. A full inbox is still waited on, in order (backpressure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from troupe.actors.shell import Actor, send_batch
from troupe.actors.thread_inbox import ThreadInbox

pytestmark = pytest.mark.anyio


class Fan:
    """Answers each message with `copies` messages to "out"."""

    def __init__(self, copies: int) -> None:
        self.copies = copies

    def handle(self, batch: Sequence[int]) -> list[tuple[str, Any]]:
        return [("out", (n, i)) for n in batch for i in range(self.copies)]


class Batches:
    """Records the size of each batch it is handed."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.items: list[Any] = []

    def handle(self, batch: Sequence[Any]) -> list[tuple[str, Any]]:
        self.sizes.append(len(batch))
        self.items.extend(batch)
        return []


async def _fan_out(copies: int, inbox: Any, outbox: Any) -> Batches:
    """One message into a Fan actor whose `copies` answers go to a Batches actor over `inbox`
    (`outbox`: its sending end); the Batches core once all of them are in."""
    send_in, recv_in = anyio.create_memory_object_stream[int](10)
    sink = Batches()
    fan = Actor("fan", Fan(copies), recv_in, {"out": outbox})
    out = Actor("out", sink, inbox, {})
    async with anyio.create_task_group() as tg:
        await tg.start(out.run)  # waiting on its inbox before the batch comes
        await tg.start(fan.run)
        await send_in.send(7)
        with anyio.fail_after(60):  # a hang guard only
            while len(sink.items) < copies:
                await anyio.sleep(0.001)
        tg.cancel_scope.cancel()
    return sink


async def test_a_loop_actors_batch_arrives_as_one_batch() -> None:
    send, recv = anyio.create_memory_object_stream[Any](100)
    sink = await _fan_out(30, recv, send)
    assert sink.sizes == [30]  # one batch (it was 30 of one message each)
    assert sink.items == [(7, i) for i in range(30)]


async def test_a_full_inbox_is_waited_on_in_order() -> None:
    send, recv = anyio.create_memory_object_stream[int](2)
    got: list[int] = []

    async def drain() -> None:
        async for n in recv:
            got.append(n)
            await anyio.sleep(0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain)
        with anyio.fail_after(60):  # a hang guard only
            await send_batch([(send, n) for n in range(9)])
            send.close()
    assert got == list(range(9))


async def test_a_thread_actors_inbox_gets_the_batch_in_one_wake() -> None:
    inbox = ThreadInbox(100)
    sink = await _fan_out(20, inbox, inbox.sender())
    assert sink.sizes == [20]
    assert sink.items == [(7, i) for i in range(20)]
