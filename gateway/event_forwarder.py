"""The engine child's outbox: engine events -> EventBatch frames on the gateway's socket.

`put` is Engine.submit's `on_event` for every request. The router calls it for each event of
one StreamBatch without yielding, so the events of one step gather in one group; a callback
scheduled when the group opens seals it, and the writer task sends each sealed group as one
EventBatch stamped with the time it was delivered (the metrics' inter-token gaps stay the
engine's own). Stats snapshots ride along with the next frame, or alone when a step freed
blocks without events.

Backpressure: the writer waits for the socket (`drain`). While the gateway is behind, groups
queue here; a request whose queued events pass `max_pending` (max_stream_buffer) is cut off as a
slow in-process reader would be: a Failed event now, its abort sent to the engine, and its
later events dropped. So memory stays bounded however far the gateway falls behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any

from troupe.messages import EngineStats, Failed, StreamEvent
from troupe.messages.engine_protocol import EventBatch, FromEngine, encode_frame

AbortFn = Callable[[str, str], Coroutine[Any, Any, None]]


class EventForwarder:
    """Groups events per router batch and writes them, in order, at the socket's pace."""

    def __init__(self, writer: asyncio.StreamWriter, max_pending: int) -> None:
        self._writer = writer
        self._max_pending = max_pending
        self._groups: list[tuple[float, list[StreamEvent]]] = []
        self._open: list[StreamEvent] | None = None  # the group of the batch being delivered
        self._num_pending: dict[str, int] = {}  # queued events per request
        self._cut_off: set[str] = set()  # cut off, terminal event not yet seen
        self._stats: EngineStats | None = None
        self._abort: AbortFn | None = None
        self._aborts: set[asyncio.Task[None]] = set()
        self._wakeup = asyncio.Event()
        self._is_closing = False
        self._is_broken = False
        self._task = asyncio.create_task(self._write_loop())

    def attach(self, abort: AbortFn) -> None:
        """How to abort a request cut off for falling behind (the engine's `abort`)."""
        self._abort = abort

    def send(self, message: FromEngine) -> None:
        """A frame outside the event stream (Hello), written at once."""
        self._writer.write(encode_frame(message))

    def on_stats(self, stats: EngineStats) -> None:
        self._stats = stats
        self._wakeup.set()

    def put(self, event: StreamEvent) -> None:
        if self._is_broken:
            return  # the gateway is gone; the engine is being stopped
        request_id = event.request_id
        if request_id in self._cut_off:
            if event.is_terminal:
                self._cut_off.discard(request_id)
            return
        num_pending = self._num_pending.get(request_id, 0) + 1
        self._num_pending[request_id] = num_pending
        if num_pending > self._max_pending and not event.is_terminal:
            event = self._cut(request_id)
        if self._open is None:
            self._open = []
            self._groups.append((time.monotonic(), self._open))
            asyncio.get_running_loop().call_soon(self._seal)
        self._open.append(event)
        self._wakeup.set()

    def _cut(self, request_id: str) -> Failed:
        self._cut_off.add(request_id)
        if self._abort is not None:
            task = asyncio.create_task(self._abort(request_id, "stream reader too slow"))
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)
        return Failed(
            request_id=request_id,
            message=f"the gateway fell more than {self._max_pending} events behind "
            "(max_stream_buffer); the request was aborted",
        )

    def _seal(self) -> None:
        self._open = None

    async def close(self, timeout: float) -> None:
        """Write what is queued (for up to `timeout` s: the gateway may have stopped reading),
        then stop the writer."""
        self._is_closing = True
        self._wakeup.set()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._task)
        self._task.cancel()

    async def _write_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            groups, self._groups, self._open = self._groups, [], None
            self._num_pending.clear()
            stats, self._stats = self._stats, None
            if groups or stats is not None:
                if not groups:
                    groups = [(time.monotonic(), [])]
                *first, (last_time, last_events) = groups
                frames = [
                    encode_frame(EventBatch(events=tuple(e), stats=None, time=t)) for t, e in first
                ]
                frames.append(
                    encode_frame(EventBatch(events=tuple(last_events), stats=stats, time=last_time))
                )
                try:
                    self._writer.write(b"".join(frames))
                    await self._writer.drain()
                except ConnectionError:
                    self._is_broken = True
                    return
            if self._is_closing and not self._groups and self._stats is None:
                return
