"""How a proxied SSE stream ends, per endpoint: the router tells a replica that finished its
answer from one that stopped half-way by the stream's last event.

    completions, chat   data: {...}            ...  data: [DONE]             OpenAI's sentinel
    responses           event: response.created ... event: response.completed  no sentinel: the
                                                    (or error, response.failed/incomplete)
    messages            event: message_start ...    event: message_stop     last event's type
                                                    (or error)               (Anthropic's)

A stream whose last event is not its endpoint's end gets that endpoint's own error event, so
the client's SDK reads the failure where it reads the replica's: chat's `data: {"error": ...}`
and `[DONE]`; a Responses `error` event numbered after the last event the client got;
Anthropic's `error` event.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from troupe.gateway.anthropic_errors import anthropic_error
from troupe.gateway.errors import ApiError
from troupe.gateway.sse_frames import typed_sse

_DONE = b"data: [DONE]"
# The events a Responses stream ends with (troupe sends completed or error; OpenAI the others)
_RESPONSES_ENDS = frozenset(
    {"response.completed", "response.failed", "response.incomplete", "error"}
)


class LastEvent:
    """The last complete event of an SSE byte stream fed chunk by chunk (an event ends at a
    blank line; troupe and vLLM end lines with \\n)."""

    def __init__(self) -> None:
        self.event = b""  # the last complete event, without its blank line
        self._partial = b""  # bytes after it: an event still arriving

    def feed(self, chunk: bytes) -> None:
        data = self._partial + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._partial = data
            return
        start = data.rfind(b"\n\n", 0, end)
        self.event = data[start + 2 if start >= 0 else 0 : end]
        self._partial = data[end + 2 :]

    @property
    def is_complete(self) -> bool:
        """Whether nothing follows the last complete event (a cut event is no end)."""
        return not self._partial.strip()


class StreamFormat(Protocol):
    """An endpoint's SSE framing, as far as the router needs it."""

    def is_end(self, event: bytes) -> bool:
        """Whether `event` (a complete event) ends a stream that ended well."""
        ...

    def error_frames(self, error: ApiError, last: bytes) -> bytes:
        """The frames that end a broken stream whose last complete event was `last`."""
        ...


class DoneSentinel:
    """/v1/completions and /v1/chat/completions: `data: [DONE]` ends the stream."""

    def is_end(self, event: bytes) -> bool:
        return event == _DONE

    def error_frames(self, error: ApiError, last: bytes) -> bytes:
        return f"data: {json.dumps(error.body())}\n\n".encode() + _DONE + b"\n\n"


class ResponsesEvents:
    """/v1/responses: named events, each with its `sequence_number`; the last one's type ends."""

    def is_end(self, event: bytes) -> bool:
        return _event_type(event) in _RESPONSES_ENDS

    def error_frames(self, error: ApiError, last: bytes) -> bytes:
        _, data = _fields(last)
        number = data.get("sequence_number") if isinstance(data, dict) else None
        event = {
            "type": "error",
            "sequence_number": number + 1 if isinstance(number, int) else 0,
            "code": error.code,
            "message": error.message,
            "param": error.param,
        }
        return f"event: error\ndata: {json.dumps(event)}\n\n".encode()


def _event_type(event: bytes) -> str | None:
    """A named event's type: its `event:` line, else (the line is optional in SSE) its data's
    `type`."""
    name, data = _fields(event)
    if name is None and isinstance(data, dict):
        type_ = data.get("type")
        return type_ if isinstance(type_, str) else None
    return name


def _fields(event: bytes) -> tuple[str | None, Any]:
    """An event's name (None without one) and its data as JSON (None when it is not)."""
    name, lines = None, []
    for line in event.decode(errors="replace").split("\n"):
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            lines.append(value)
    try:
        return name, json.loads("\n".join(lines))
    except ValueError:
        return name, None


class AnthropicEvents:
    """/v1/messages: named events; message_stop (or an error event) ends."""

    def is_end(self, event: bytes) -> bool:
        return _event_type(event) in ("message_stop", "error")

    def error_frames(self, error: ApiError, last: bytes) -> bytes:
        return typed_sse(anthropic_error(error)).encode()


DONE_SENTINEL, RESPONSES_EVENTS = DoneSentinel(), ResponsesEvents()
ANTHROPIC_EVENTS = AnthropicEvents()
