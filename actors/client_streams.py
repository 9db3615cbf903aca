"""Per-request output streams at the client edge: the last hop of every event.

The Streamer sends one StreamBatch per step; `ClientStreams.dispatch` fans its events out to
each request's bounded channel without ever blocking. A reader that falls `max_buffer` events
behind is cut off: its channel closes and its iterator ends with a Failed event, so a slow
client costs bounded memory and never stalls the graph.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

import anyio
import sniffio
from troupe.messages import Failed, StreamBatch, StreamEvent

EventListener = Callable[[StreamEvent, float], None]
STOPPED = "engine stopped before this request finished"  # a stream's end, engine gone


def _stopped() -> str:
    return STOPPED


class _Event(Protocol):
    def set(self) -> object: ...

    async def wait(self) -> object: ...


def native_event_factory() -> Callable[[], _Event]:
    """The running backend's own Event class. anyio.Event looks the backend up on every
    construction; a reader creates one per wait, 256 times a step at full batch."""
    backend = sniffio.current_async_library()
    if backend == "trio":
        import trio

        return trio.Event
    if backend == "asyncio":
        import asyncio

        return asyncio.Event
    return anyio.Event


class ClientStream:
    """The engine's side of one request's stream: a bounded queue with one waiting reader.

    Lighter than a memory channel on purpose: at 256 running requests the router delivers 256
    events per step, and a reader that wakes takes everything queued in one go.
    """

    def __init__(
        self, request_id: str, max_buffer: int, new_event: Callable[[], _Event] = anyio.Event
    ) -> None:
        self.request_id = request_id
        self._new_event = new_event
        self.max_buffer = max_buffer
        self.is_overflowed = False
        self.is_closed = False
        self.is_ended = False  # its terminal event was handed to the reader
        self._queue: deque[StreamEvent] = deque()
        self._waiter: _Event | None = None

    def put(self, event: StreamEvent) -> bool:
        """Queue an event; False (and the stream closes) when the reader is too far behind."""
        if self.is_closed:
            return True
        if len(self._queue) >= self.max_buffer:
            self.is_overflowed = True
            self.close()
            return False
        self._queue.append(event)
        self._wake()
        return True

    def close(self) -> None:
        self.is_closed = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None

    async def get_batch(self) -> list[StreamEvent]:
        """Everything queued, waiting for at least one event; [] once closed and drained."""
        while not self._queue:
            if self.is_closed:
                return []
            self._waiter = self._new_event()
            await self._waiter.wait()
        events = list(self._queue)
        self._queue.clear()
        return events

    async def events(
        self, stopped_message: Callable[[], str] = _stopped
    ) -> AsyncGenerator[StreamEvent, None]:
        """The request's events up to and including its terminal one, which sets `is_ended`
        as it is handed out (a reader that ends before it aborts the request). A stream closed
        without one ends with Failed: cut off, or the engine stopped (`stopped_message()`)."""
        while True:
            events = await self.get_batch()
            if not events:
                self.is_ended = True
                yield self.end_event(stopped_message())
                return
            for event in events:
                self.is_ended = event.is_terminal
                yield event
                if self.is_ended:
                    return

    def end_event(self, stopped_message: str) -> Failed:
        """The terminal event of a stream closed without one: cut off, or the engine stopped."""
        if self.is_overflowed:
            return self.overflow_event()
        return Failed(request_id=self.request_id, message=stopped_message)

    def overflow_event(self) -> Failed:
        return Failed(
            request_id=self.request_id,
            message=f"stream reader too slow: fell more than {self.max_buffer} events behind "
            "(max_stream_buffer); the request was aborted",
        )


class CallbackSink:
    """A request whose events go to a callback on the event loop (`Engine.submit`): no task
    per request, so batch jobs pay nothing per event beyond the call."""

    def __init__(self, request_id: str, on_event: Callable[[StreamEvent], None]) -> None:
        self.request_id = request_id
        self.is_closed = False
        self.is_overflowed = False
        self._on_event = on_event

    def put(self, event: StreamEvent) -> bool:
        if not self.is_closed:
            if event.is_terminal:
                self.is_closed = True
            self._on_event(event)
        return True

    def close(self) -> None:
        if not self.is_closed:  # closed before its terminal event: the engine is stopping
            self.put(Failed(request_id=self.request_id, message="engine stopped"))


class ClientStreams:
    """Registry of open request streams, owned by the engine's router task."""

    def __init__(self, max_buffer: int) -> None:
        self._max_buffer = max_buffer
        self._streams: dict[str, ClientStream | CallbackSink] = {}
        self._new_event: Callable[[], _Event] | None = None
        self._empty = anyio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._streams)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._streams

    def ids(self) -> list[str]:
        return list(self._streams)

    def open(self, request_id: str) -> ClientStream:
        """A stream read by one task (`Engine.generate`)."""
        if self._new_event is None:
            self._new_event = native_event_factory()
        stream = ClientStream(request_id, self._max_buffer, self._new_event)
        self._register(stream)
        return stream

    def open_callback(self, request_id: str, on_event: Callable[[StreamEvent], None]) -> None:
        """A request whose events are handed to `on_event` (`Engine.submit`)."""
        self._register(CallbackSink(request_id, on_event))

    def _register(self, stream: ClientStream | CallbackSink) -> None:
        if stream.request_id in self._streams:
            raise ValueError(f"request_id {stream.request_id!r} is already in use")
        self._streams[stream.request_id] = stream
        if self._empty.is_set():
            self._empty = anyio.Event()

    def close(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.close()
        if not self._streams:
            self._empty.set()

    async def wait_empty(self) -> None:
        await self._empty.wait()

    def dispatch(self, batch: StreamBatch, now: float, listeners: list[EventListener]) -> list[str]:
        """Deliver the batch; return ids of readers cut off for being too slow."""
        cut_off: list[str] = []
        for event in batch.events:
            for listener in listeners:
                listener(event, now)
            stream = self._streams.get(event.request_id)
            if stream is None or stream.is_closed:
                continue  # the client left, or was cut off; its abort is on the way
            if not stream.put(event):
                cut_off.append(event.request_id)
            elif event.is_terminal:
                if isinstance(stream, CallbackSink):
                    self.close(event.request_id)  # no reader task will close it
                else:
                    stream.close()
        return cut_off

    def fail_one(self, request_id: str, message: str) -> Failed | None:
        """Give one stream a Failed terminal event; the event, unless the stream had already
        ended (its terminal event delivered, or cut off) or is unknown."""
        stream = self._streams.get(request_id)
        if stream is None:
            return None
        event = None if stream.is_closed else Failed(request_id=request_id, message=message)
        if event is not None:
            stream.put(event)
        stream.close()
        if isinstance(stream, CallbackSink):
            self.close(request_id)
        return event

    def fail_all(self, message: str) -> list[Failed]:
        """Give every open stream a Failed terminal event (engine crash or forced stop); the
        events given (for listeners: a stream that had already ended gets none)."""
        failed = (self.fail_one(request_id, message) for request_id in list(self._streams))
        return [event for event in failed if event is not None]
