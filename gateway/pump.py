"""Moves one request's engine events into a connection's Outbox, never waiting on the socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

from aiohttp import web
from troupe.gateway.outbox import Outbox, Overflow
from troupe.messages import StreamEvent

Encoder = Callable[[StreamEvent], Iterable[str]]


async def pump(
    events: AsyncIterator[StreamEvent],
    outbox: Outbox,
    encode: Encoder,
    first: StreamEvent | None = None,
) -> StreamEvent | None:
    """Encode every event into `outbox` until the terminal one, which is returned.

    Owns `events` and closes it on the way out, so leaving early (Overflow, cancellation)
    aborts the request in the engine. Raises Overflow when the reader fell too far behind.
    """
    async with contextlib.aclosing(events):  # type: ignore[type-var]
        if first is not None:
            for frame in encode(first):
                outbox.put(frame)
            if first.is_terminal:
                return first
        async for event in events:
            for frame in encode(event):
                outbox.put(frame)
            if event.is_terminal:
                return event
    return None


def abort_transport_later(request: web.Request, seconds: float) -> asyncio.TimerHandle:
    """After an overflow the writer may be stuck on a stalled socket: drop it after `seconds`.

    Cancel the returned handle once the writer has flushed its last frame.
    """

    def abort() -> None:
        transport = request.transport
        if transport is not None:
            transport.abort()

    return asyncio.get_running_loop().call_later(seconds, abort)


__all__ = ["Encoder", "Overflow", "abort_transport_later", "pump"]
