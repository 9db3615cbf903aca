"""The shell every actor runs in: receive a batch, hand it to the core, send the results.

Blocks for the first message, then drains what else is waiting without blocking (up to
`max_batch`), so a busy inbox is answered in one batch (mini-sglang's tokenize worker does the
same). When the inbox closes, the actor closes its outboxes and returns.

An actor on the event loop reads an anyio stream. A thread actor (its core blocks: GPU work,
tokenizing, grammar masks) runs the same loop in a thread of its own over a ThreadInbox
(thread_inbox.py): it sends to another thread actor straight into that one's inbox, and to an
event-loop actor through the loop (`anyio.from_thread.run`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from troupe.actors.core.base import Core
from troupe.actors.thread_inbox import InboxCancelled, InboxSender, ThreadInbox
from troupe.messages.graph_stats import ActorStats, ChannelCount
from troupe.messages.trace import TraceWriter

Inbox = MemoryObjectReceiveStream[Any] | ThreadInbox  # a ThreadInbox: a thread actor
Outbox = MemoryObjectSendStream[Any] | InboxSender


class Actor:
    """One actor: a name, a core, an inbox and its outboxes (keyed by receiving actor). With a
    ThreadInbox, its core runs in a thread of its own (GPU work, tokenizing: off the loop)."""

    def __init__(
        self,
        name: str,
        core: Core[Any],
        inbox: Inbox,
        outboxes: Mapping[str, Outbox],
        *,
        max_batch: int = 256,
        tracer: TraceWriter | None = None,
    ) -> None:
        self.name = name
        self.core = core
        self._inbox = inbox
        self._outboxes = dict(outboxes)
        self._max_batch = max_batch
        self._tracer = tracer
        self.busy_seconds = 0.0  # inside core.handle: the actor's own CPU cost, for benchmarks
        self.busy_since: float | None = None  # monotonic start of the handle() in progress
        # Message counts for statistics(): kept here because every message passes through
        # this loop (one int add per message; read on demand, never published per step).
        self.num_received = 0
        self.num_batches = 0
        self._num_sent = dict.fromkeys(self._outboxes, 0)
        # Set by a watchdog that gave up on a handle() that never returns: cancellation then
        # abandons the worker thread instead of waiting for it.
        self.is_hung = False

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if isinstance(self._inbox, ThreadInbox):
            await self._run_thread(self._inbox, task_status)
            return
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self._inbox)
            for outbox in self._outboxes.values():
                await stack.enter_async_context(outbox)
            task_status.started()
            batch_no = 0
            async for first in self._inbox:
                out = self._handle(self._drain(first), batch_no)
                for dest, msg in out:
                    self._sent(dest, msg, batch_no)
                await send_batch([(self._outboxes[dest], msg) for dest, msg in out])
                batch_no += 1

    def _handle(self, batch: list[Any], batch_no: int) -> Any:
        self.num_received += len(batch)
        self.num_batches += 1
        if self._tracer is not None:
            self._record("recv", self.name, batch_no, batch)
        start = time.perf_counter()
        self.busy_since = time.monotonic()
        try:
            return self.core.handle(batch)
        finally:
            self.busy_since = None
            self.busy_seconds += time.perf_counter() - start

    def _sent(self, dest: str, msg: Any, batch_no: int) -> None:
        if self._tracer is not None:
            self._record("send", dest, batch_no, (msg,))
        self._num_sent[dest] += 1

    async def _run_thread(self, inbox: ThreadInbox, task_status: TaskStatus[None]) -> None:
        """The actor's loop in a thread of its own. Cancelled, it waits for a handle() that
        began (the core's state must not change under whoever runs next), unless the actor
        is hung; the thread then stops before the next batch."""
        token = anyio.lowlevel.current_token()
        done = anyio.Event()
        error: list[BaseException] = []

        def main() -> None:
            try:
                self._thread_loop(inbox, token)
            except BaseException as exc:  # raised in the actor's task (below)
                error.append(exc)
            finally:
                try:
                    anyio.from_thread.run_sync(done.set, token=token)
                except RuntimeError:
                    pass  # the loop is gone: an abandoned (hung) actor finishing late

        thread = threading.Thread(target=main, name=f"troupe-{self.name}", daemon=True)
        try:
            thread.start()
            task_status.started()
            try:
                await done.wait()
            except anyio.get_cancelled_exc_class():
                inbox.cancel()
                if not self.is_hung:
                    with anyio.CancelScope(shield=True):
                        await done.wait()
                raise
            if error:
                raise error[0]
        finally:
            inbox.close()
            for outbox in self._outboxes.values():
                outbox.close()

    def _thread_loop(self, inbox: ThreadInbox, token: anyio.lowlevel.EventLoopToken) -> None:
        batch_no = 0
        while True:
            try:
                first = inbox.get()
            except (anyio.EndOfStream, InboxCancelled):
                return
            to_loop: list[tuple[MemoryObjectSendStream[Any], Any]] = []
            for dest, msg in self._handle(self._drain(first), batch_no):
                self._sent(dest, msg, batch_no)
                outbox = self._outboxes[dest]
                if isinstance(outbox, InboxSender):
                    outbox.put(msg)  # thread to thread: no trip through the event loop
                else:
                    to_loop.append((outbox, msg))
            if to_loop:  # one trip through the loop for all of them, in order
                anyio.from_thread.run(send_batch, to_loop, token=token)
            batch_no += 1

    def statistics(self) -> ActorStats:
        """Counts since start and the inbox now (anyio's own channel statistics)."""
        if isinstance(self._inbox, ThreadInbox):
            depth, buffer = self._inbox.depth(), self._inbox.max_buffer
            blocked = self._inbox.num_blocked_senders
        else:
            stream = self._inbox.statistics()
            depth, buffer = stream.current_buffer_used, stream.max_buffer_size
            blocked = stream.tasks_waiting_send
        return ActorStats(
            name=self.name,
            num_received=self.num_received,
            num_batches=self.num_batches,
            busy_seconds=self.busy_seconds,
            inbox_depth=depth,
            inbox_buffer=None if math.isinf(buffer) else int(buffer),
            num_blocked_senders=blocked,
            sent=tuple(ChannelCount(receiver=d, num_messages=n) for d, n in self._num_sent.items()),
        )

    def _drain(self, first: Any) -> list[Any]:
        batch = [first]
        while len(batch) < self._max_batch:
            try:
                batch.append(self._inbox.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        return batch

    def _record(
        self, kind: str, channel: str, batch_no: int, msgs: Sequence[msgspec.Struct]
    ) -> None:
        assert self._tracer is not None
        now = time.monotonic()
        for msg in msgs:
            self._tracer.record(kind, self.name, channel, batch_no, msg, now)  # type: ignore[arg-type]


async def send_batch(messages: Sequence[tuple[Outbox, Any]]) -> None:
    """A batch's messages, in order, without yielding to the loop while their inboxes have room,
    so a receiver takes them as one batch. Sent one `await send` at a time, each a checkpoint,
    they reached the next actor one loop iteration apiece: a 300-request burst went through
    admission one request per batch, each its own scheduler batch and plan (docs/benchmarks.md,
    session 27). A full inbox is waited on as before (backpressure); thread inboxes that
    batch are woken once their messages are in."""
    to_wake: dict[int, InboxSender] = {}
    for outbox, msg in messages:
        try:
            if isinstance(outbox, InboxSender):
                if outbox.put_nowait(msg):
                    to_wake[id(outbox)] = outbox
                    continue
            else:
                outbox.send_nowait(msg)
                continue
        except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # full, or closed: the send below waits, or raises after its checkpoint
            # (so a pending cancellation, as at shutdown, still comes first)
        for sender in to_wake.values():  # what is in goes first: the reader drains meanwhile
            sender.wake()
        to_wake.clear()
        await outbox.send(msg)
    for sender in to_wake.values():
        sender.wake()
