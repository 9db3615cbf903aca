"""GET /v1/responses/{id}?stream=true[&starting_after=N]: a background response's events as SSE
(OpenAI's replay; vLLM's responses_background_stream_generator).

    running   the events so far, then live ones until it ends (BackgroundRun.follow)
    finished  the events kept with it in the store (StoredResponse.stream_events)

`starting_after` is a sequence_number: only later events are sent (-1, all of them, when left
out). A response not run in background keeps no events: a 400 naming `stream`. A follower is
only a reader: its going away leaves the run going (POST .../cancel ends it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from aiohttp import web
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.responses_background import BackgroundRun, sse_frame
from troupe.gateway.responses_output import Event
from troupe.gateway.sse_writer import SSE_HEADERS


def starting_after(text: str | None) -> int:
    if text is None:
        return -1
    try:
        number = int(text)
    except ValueError:
        number = -2
    if number < -1:
        raise invalid(
            "starting_after", f"starting_after must be an event's sequence_number, got {text!r:.40}"
        )
    return number


def replay_events(stored: list[Event], after: int, response_id: str) -> Iterable[Event]:
    """The stored events of a finished background response numbered after `after`."""
    if not stored:
        raise ApiError(
            400,
            f"stream: response {response_id!r:.100} was not created with background: true, "
            "so no events were kept to replay; GET it without stream",
            param="stream",
        )
    return (e for e in stored if e["sequence_number"] > after)


async def serve_events(
    request: web.Request, run: BackgroundRun | None, stored: Iterable[Event], after: int
) -> web.StreamResponse:
    """Write the events as SSE: a running `run`'s (followed to its end), else `stored`."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    events: AsyncIterator[Event] = run.follow(after) if run is not None else _aiter(stored)
    async for event in events:
        await response.write(sse_frame(event))
    await response.write_eof()
    return response


async def _aiter(events: Iterable[Event]) -> AsyncIterator[Event]:
    for event in events:
        yield event
