"""Chat's streamed tool calls: a sample's Delta / Finished events -> SSE chunks.

"required" / named ──► each argument piece as a tool_calls delta as it is written, then a
                       last chunk with finish_reason "tool_calls"; cut short (length), what
                       was written as text ("required") or nothing (named) with its reason
"auto"             ──► content as it comes, each call as it is written: id and name, then
                       its arguments in pieces (tool_stream.py); at the end the rest of the
                       calls and finish_reason "tool_calls", or (no call parsed) the held
                       text as content with the sample's reason
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from troupe.gateway.openai_responses import ResponseBuilder
from troupe.gateway.sse_frames import sse as _sse
from troupe.gateway.tool_calls import ToolCallStream, ToolPlan
from troupe.gateway.tool_stream import (
    ArgumentsPiece,
    CallOpened,
    ContentPiece,
    StreamedCalls,
    StreamPiece,
    streamed_calls,
)
from troupe.messages import Delta, Finished


def call_stream(plan: ToolPlan | None) -> ToolCallStream | StreamedCalls | None:
    """What reads a streamed reply's calls under `plan` (None: no tools)."""
    if plan is None:
        return None
    if plan.spec is None:
        return streamed_calls(plan.tools, plan.parser)
    return ToolCallStream(plan)


def _piece_chunk(builder: ResponseBuilder, piece: StreamPiece) -> dict[str, Any]:
    """One piece as OpenAI streams it: content, a call's id and name (arguments ""), or a
    piece of its arguments."""
    match piece:
        case ContentPiece(text=text):
            return builder.delta_chunk(text, None)
        case CallOpened(index=index, call_id=call_id, name=name):
            function = {"name": name, "arguments": ""}
            return builder.tool_call_chunk(
                [{"index": index, "id": call_id, "type": "function", "function": function}]
            )
        case ArgumentsPiece(index=index, text=text):
            return builder.tool_call_chunk([{"index": index, "function": {"arguments": text}}])


def _auto_chunks(
    builder: ResponseBuilder, calls: StreamedCalls, event: Delta | Finished
) -> Iterable[str]:
    """tool_choice "auto": content and calls as they are written (see tool_stream.py)."""
    for piece in calls.delta(event.text):
        yield _sse(_piece_chunk(builder, piece))
    if isinstance(event, Finished):
        end = calls.finish(event.finish_reason == "stop")
        if not end.is_calls:
            finish = str(event.finish_reason)
            yield _sse(builder.delta_chunk(end.text, None, finish, event.stop_reason))
            return
        for piece in end.pieces:
            yield _sse(_piece_chunk(builder, piece))
        yield _sse(builder.tool_call_chunk([], "tool_calls"))


def tool_call_chunks(
    builder: ResponseBuilder, calls: ToolCallStream | StreamedCalls, event: Delta | Finished
) -> Iterable[str]:
    """The chunks one event of a sample makes (see the module docstring)."""
    if not isinstance(calls, ToolCallStream):
        yield from _auto_chunks(builder, calls, event)
        return
    for piece in calls.delta(event.text):
        yield _sse(builder.tool_call_chunk(piece))
    if isinstance(event, Finished):
        last = calls.finish() if event.finish_reason == "stop" else None
        if last is None:  # cut short: what was written, as text
            finish = str(event.finish_reason)
            text = calls.text if calls.plan.name is None else ""
            yield _sse(builder.delta_chunk(text, None, finish, event.stop_reason))
        else:
            if last:
                yield _sse(builder.tool_call_chunk(last))
            yield _sse(builder.tool_call_chunk([], "tool_calls"))
