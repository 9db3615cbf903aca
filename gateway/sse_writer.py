"""One HTTP request's SSE answer: wait for the engine's first event, then a writer that drains
an Outbox to the socket while a task fills it (chat, completions and responses streams alike).

The first event is awaited before answering, so a rejection gets its real status (400, 429,
503) instead of a 200 stream carrying an error. The filling task owns the engine stream (via
`pump`); the writer joins what queued while its last write was out into one write (one syscall,
not one per token, when the client or this process falls behind). A client that goes away
cancels the task, and closing the engine stream aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from aiohttp import web
from troupe.gateway.errors import ApiError, error_for_event
from troupe.gateway.outbox import Outbox, Overflow
from troupe.gateway.pump import Encoder, abort_transport_later, pump
from troupe.gateway.settings import GatewaySettings
from troupe.gateway.sse_frames import sse
from troupe.messages import Aborted, Failed, Rejected, StreamEvent

log = structlog.get_logger("troupe.gateway")

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies: do not buffer the stream
}

# fill(outbox, on_overflow): put the answer's frames; `on_overflow` after an Overflow
Filler = Callable[[Outbox, Callable[[], None]], Awaitable[None]]


async def first_event(
    events: Any, client_fields: Mapping[str, str] | None = None, *, abort_answers: bool = False
) -> StreamEvent:
    """The first event of `events` (an engine stream); a rejection (or failure) raises the
    ApiError it stands for, with the stream closed. `abort_answers`: an abort is an answer,
    not an error (SGLang's /generate ends it with finish_reason "abort")."""
    try:
        first: StreamEvent = await anext(events)
    except BaseException:
        await events.aclose()
        raise
    if isinstance(first, Rejected | Failed) or (isinstance(first, Aborted) and not abort_answers):
        await events.aclose()
        raise error_for_event(first, client_fields)
    return first


async def pump_sse(
    events: Any,
    outbox: Outbox,
    encode: Encoder,
    first: StreamEvent,
    on_overflow: Callable[[], None],
    overflow_frames: Callable[[ApiError], list[str]] | None = None,
) -> None:
    """`pump` the engine stream into an SSE answer's outbox; a reader that fell too far
    behind gets one last chunk, a 429 `slow_consumer` error (then `on_overflow`):
    `overflow_frames(error)`, the endpoint's error frames (default: OpenAI's `data:` one)."""
    try:
        await pump(events, outbox, encode, first)
    except Overflow as exc:
        error = ApiError(429, str(exc), code="slow_consumer")
        frames = [sse(error.body())] if overflow_frames is None else overflow_frames(error)
        for frame in frames:
            outbox.put_final(frame)
        on_overflow()


async def serve_sse(
    request: web.Request, settings: GatewaySettings, fill: Filler, request_id: str
) -> web.StreamResponse:
    """Answer with an event stream that `fill` writes; returns once it is written out (or the
    client went away, which cancels `fill`)."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    outbox = Outbox(max_frames=settings.max_buffered_frames, max_bytes=settings.max_buffered_bytes)
    abort_timers: list[asyncio.TimerHandle] = []

    def on_overflow() -> None:
        # The writer may be stuck on a stalled peer: drop the connection after the grace.
        abort_timers.append(abort_transport_later(request, settings.slow_client_grace))

    async def filled() -> None:
        try:
            await fill(outbox, on_overflow)
        finally:
            outbox.close()

    task = asyncio.create_task(filled())
    try:
        while frames := await outbox.get_all():
            await response.write("".join(frames).encode())
        await response.write_eof()
    except ConnectionError:
        log.debug("client went away mid-stream", request_id=request_id)
    finally:
        for timer in abort_timers:
            timer.cancel()
        if not task.done():
            task.cancel()  # the client went away: closing the stream aborts the request
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return response
