"""The async shell every actor runs in: receive a batch, hand it to the core, send the results.

Blocks for the first message, then drains what else is waiting without blocking (up to
`max_batch`), so a busy inbox is answered in one batch (mini-sglang's tokenize worker does the
same). When the inbox closes, the actor closes its outboxes and returns.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from troupe.actors.core.base import Core
from troupe.messages.graph_stats import ActorStats, ChannelCount
from troupe.messages.trace import TraceWriter


class Actor:
    """One actor: a name, a core, an inbox and its outboxes (keyed by receiving actor)."""

    def __init__(
        self,
        name: str,
        core: Core[Any],
        inbox: MemoryObjectReceiveStream[Any],
        outboxes: Mapping[str, MemoryObjectSendStream[Any]],
        *,
        max_batch: int = 256,
        in_thread: bool = False,
        tracer: TraceWriter | None = None,
    ) -> None:
        self.name = name
        self.core = core
        self._inbox = inbox
        self._outboxes = dict(outboxes)
        self._max_batch = max_batch
        self._in_thread = in_thread  # GPU work and long tokenization stay off the event loop
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
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self._inbox)
            for outbox in self._outboxes.values():
                await stack.enter_async_context(outbox)
            task_status.started()
            batch_no = 0
            async for first in self._inbox:
                batch = self._drain(first)
                self.num_received += len(batch)
                self.num_batches += 1
                if self._tracer is not None:
                    self._record("recv", self.name, batch_no, batch)
                start = time.perf_counter()
                self.busy_since = time.monotonic()
                if self._in_thread:
                    out = await self._handle_in_thread(batch)
                else:
                    out = self.core.handle(batch)
                self.busy_since = None
                self.busy_seconds += time.perf_counter() - start
                num_sent = self._num_sent
                for dest, msg in out:
                    if self._tracer is not None:
                        self._record("send", dest, batch_no, (msg,))
                    await self._outboxes[dest].send(msg)
                    num_sent[dest] += 1
                batch_no += 1

    def statistics(self) -> ActorStats:
        """Counts since start and the inbox now (anyio's own channel statistics)."""
        inbox = self._inbox.statistics()
        buffer = inbox.max_buffer_size
        return ActorStats(
            name=self.name,
            num_received=self.num_received,
            num_batches=self.num_batches,
            busy_seconds=self.busy_seconds,
            inbox_depth=inbox.current_buffer_used,
            inbox_buffer=None if math.isinf(buffer) else int(buffer),
            num_blocked_senders=inbox.tasks_waiting_send,
            sent=tuple(ChannelCount(receiver=d, num_messages=n) for d, n in self._num_sent.items()),
        )

    async def _handle_in_thread(self, batch: list[Any]) -> Any:
        """core.handle in a worker thread. Cancelled, it still waits for a handle() that began
        (the core's state must not change under whoever runs next), unless the actor is hung;
        one that had not begun never runs."""
        lock = threading.Lock()
        finished = threading.Event()
        state = {"began": False, "cancelled": False}

        def work() -> Any:
            with lock:
                if state["cancelled"]:
                    return None
                state["began"] = True
            try:
                return self.core.handle(batch)
            finally:
                finished.set()

        try:
            return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with lock:
                state["cancelled"] = True
                began = state["began"]
            if began and not self.is_hung:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(finished.wait)
            raise

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
