"""Chat's streamed tool calls: a sample's Delta / Finished events -> SSE chunks.

"required" / named ──► each argument piece as a tool_calls delta as it is written, then a
                       last chunk with finish_reason "tool_calls"; cut short (length), what
                       was written as text ("required") or nothing (named) with its reason
"auto"             ──► content as it comes; at the end each call found (if any) as OpenAI
                       streams one (id and name, then the arguments), or the rest as
                       content with the sample's reason
"""

from __future__ import annotations

from collections.abc import Iterable

from troupe.gateway.openai_responses import ResponseBuilder
from troupe.gateway.sse_frames import sse as _sse
from troupe.gateway.tool_auto import AutoCallStream, auto_tool_stream
from troupe.gateway.tool_calls import ToolCallStream, ToolPlan
from troupe.messages import Delta, Finished


def call_stream(plan: ToolPlan | None) -> ToolCallStream | AutoCallStream | None:
    """What reads a streamed reply's calls under `plan` (None: no tools)."""
    if plan is None:
        return None
    if plan.spec is None:
        return auto_tool_stream(plan.tools, plan.parser)
    return ToolCallStream(plan)


def _auto_chunks(
    builder: ResponseBuilder, calls: AutoCallStream, event: Delta | Finished
) -> Iterable[str]:
    """tool_choice "auto": content as it comes, the calls (if any) at the end."""
    if text := calls.delta(event.text):
        yield _sse(builder.delta_chunk(text, None))
    if isinstance(event, Finished):
        rest, found = calls.finish(event.finish_reason == "stop")
        if not found:
            finish = str(event.finish_reason)
            yield _sse(builder.delta_chunk(rest, None, finish, event.stop_reason))
            return
        if rest:
            yield _sse(builder.delta_chunk(rest, None))
        for i, call in enumerate(found):  # as OpenAI's: the name first, then the arguments
            function = call["function"]
            head = {"index": i, "id": call["id"], "type": call["type"]}
            opened = {**head, "function": {"name": function["name"], "arguments": ""}}
            yield _sse(builder.tool_call_chunk([opened]))
            if function["arguments"]:
                arguments = {"index": i, "function": {"arguments": function["arguments"]}}
                yield _sse(builder.tool_call_chunk([arguments]))
        yield _sse(builder.tool_call_chunk([], "tool_calls"))


def tool_call_chunks(
    builder: ResponseBuilder, calls: ToolCallStream | AutoCallStream, event: Delta | Finished
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
