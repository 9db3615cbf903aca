"""Thread actors: messages between two of them go thread to thread, never through the loop;
loop senders feel backpressure; a thread actor ends when its senders close, and a cancelled one
waits for the handle() it began."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from troupe.actors.shell import Actor
from troupe.actors.thread_inbox import ThreadInbox

pytestmark = pytest.mark.anyio

HANG = 60  # s: a hang detector only


class PingPong:
    """Answers each int n with n + 1 to `peer`, until `last`; then sets `done`."""

    def __init__(self, peer: str, last: int, done: threading.Event) -> None:
        self.peer, self.last, self.done = peer, last, done
        self.threads: set[int] = set()

    def handle(self, batch: Sequence[int]) -> list[tuple[str, Any]]:
        self.threads.add(threading.get_ident())
        out: list[tuple[str, Any]] = []
        for n in batch:
            if n >= self.last:
                self.done.set()
            else:
                out.append((self.peer, n + 1))
        return out


async def test_thread_actors_talk_while_the_event_loop_is_blocked() -> None:
    done = threading.Event()
    a_inbox, b_inbox = ThreadInbox(2), ThreadInbox(2)
    a_core, b_core = PingPong("b", 100, done), PingPong("a", 100, done)
    a = Actor("a", a_core, a_inbox, {"b": b_inbox.sender()})
    b = Actor("b", b_core, b_inbox, {"a": a_inbox.sender()})
    kick = a_inbox.sender()
    async with anyio.create_task_group() as tg:
        await tg.start(a.run)
        await tg.start(b.run)
        await kick.send(0)
        # The loop thread blocks here: 100 messages can only pass if no hop needs the loop.
        assert done.wait(HANG), "the ping-pong stalled: it needed the event loop"
        tg.cancel_scope.cancel()
    assert a_core.threads.isdisjoint(b_core.threads)  # each actor has a thread of its own
    assert a.num_received + b.num_received == 101


class Gate:
    """Holds every handle() until `release` is set; forwards each message to "out"."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.seen: list[int] = []

    def handle(self, batch: Sequence[int]) -> list[tuple[str, Any]]:
        self.started.set()
        assert self.release.wait(HANG)
        self.seen.extend(batch)
        return [("out", n) for n in batch]


async def test_a_full_inbox_holds_loop_senders_back_and_ends_with_its_senders() -> None:
    gate = Gate()
    inbox = ThreadInbox(1)
    out_send, out_recv = anyio.create_memory_object_stream[int](10)
    actor = Actor("gate", gate, inbox, {"out": out_send}, max_batch=1)
    sender = inbox.sender()
    sent: list[int] = []

    async def produce() -> None:
        async with sender:
            for n in range(4):
                await sender.send(n)
                sent.append(n)

    async with anyio.create_task_group() as tg:
        await tg.start(actor.run)
        tg.start_soon(produce)
        await anyio.to_thread.run_sync(gate.started.wait)
        # 0 is in handle(), 1 fills the inbox: 2 waits for room (a poll with a hang bound).
        with anyio.fail_after(HANG):
            while not (sent == [0, 1] and inbox.num_blocked_senders == 1):
                await anyio.sleep(0.001)
        assert actor.statistics().num_blocked_senders == 1 and gate.seen == []
        gate.release.set()
        async with out_recv:
            received = [n async for n in out_recv]  # ends: the sender closed, then the actor
    assert received == [0, 1, 2, 3] == gate.seen


async def test_cancelled_thread_actor_waits_for_its_handle() -> None:
    gate = Gate()
    inbox = ThreadInbox(4)
    out_send, out_recv = anyio.create_memory_object_stream[int](10)
    actor = Actor("gate", gate, inbox, {"out": out_send}, max_batch=1)
    sender = inbox.sender()
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run)
        await sender.send(7)
        await sender.send(8)
        await anyio.to_thread.run_sync(gate.started.wait)
        tg.cancel_scope.cancel()
        threading.Thread(target=gate.release.set).start()  # after the cancel
    # The actor's task ended only after its handle() of 7 did; 8 never ran.
    assert gate.seen == [7]
    with pytest.raises(anyio.BrokenResourceError):
        await sender.send(9)  # the actor is gone
    out_recv.close()


class Sizes:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def handle(self, batch: Sequence[int]) -> list[tuple[str, Any]]:
        self.sizes.append(len(batch))
        return []


async def test_what_the_loop_sends_in_one_iteration_is_one_batch() -> None:
    core = Sizes()
    inbox = ThreadInbox(16)
    actor = Actor("sizes", core, inbox, {})
    sender = inbox.sender()
    async with anyio.create_task_group() as tg:
        await tg.start(actor.run)
        async with anyio.create_task_group() as senders:
            for n in range(8):  # eight tasks, each sending in the same loop iteration
                senders.start_soon(sender.send, n)
        sender.close()  # the actor ends once it has read them
    assert core.sizes == [8]
