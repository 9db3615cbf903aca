"""One request run to its end for a whole (not streamed) answer, fed event by event to what
assembles it (the Responses API's and Anthropic's routes)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from troupe.gateway.errors import ApiError, error_for_event
from troupe.gateway.state import Gateway
from troupe.messages import Aborted, Delta, Failed, Finished, Rejected, SamplingParams

T = TypeVar("T")


async def whole_answer(
    gateway: Gateway,
    prompt: Any,
    params: SamplingParams,
    request_id: str,
    feed: Callable[[Delta | Finished], T | None],
    client_fields: Mapping[str, str] | None = None,
) -> T:
    """`feed` each event until it returns the answer. A rejection, abort or failure raises its
    ApiError (`client_fields` renaming the field); a vanished client cancels the handler, and
    leaving closes the stream, which aborts the request."""
    gateway.stream_opened()
    try:
        events: Any = gateway.engine.generate(prompt, params, request_id=request_id)
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, Rejected | Aborted | Failed):
                    raise error_for_event(event, client_fields)
                if (answer := feed(event)) is not None:
                    return answer
        raise ApiError(500, "the engine ended the stream without a terminal event")
    finally:
        gateway.stream_closed()
