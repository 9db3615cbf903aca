"""tool_choice "auto" for MiniMax-M2 (vLLM's `--tool-call-parser minimax_m2`):

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>
    <invoke name="get_time">
    </invoke>
    </minimax:tool_call>

Text before the first `<minimax:tool_call>` is the content; what follows the calls is dropped,
as vLLM does. Names may be quoted ("..." or '...') or bare; each value loses its surrounding
whitespace and is typed by the tool's JSON schema as Qwen3-Coder's are (gateway/
tool_qwen3_coder.py's `typed_value`). Every block and invoke must be closed and name a known
tool, or the reply is text. Ids are `call_` and 24 hex digits, as vLLM's. Streamed
(`MiniMaxM2Reader`), a call opens once its `<invoke name=...>` is written and each parameter's
`"key": value` goes out once its `</parameter>` is, so the pieces put together are the whole
parse's `json.dumps` text.
"""

from __future__ import annotations

import json

from troupe.gateway.tool_format import CallFormat, ToolCallDict, ToolSchemas, make_call
from troupe.gateway.tool_qwen3_coder import typed_value
from troupe.gateway.tool_reader import (
    CallSoFar,
    SectionSoFar,
    members_so_far,
    openai_call_id,
    spans,
)

OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_OPEN, INVOKE_CLOSE = "<invoke name=", "</invoke>"
PARAM_OPEN, PARAM_CLOSE = "<parameter name=", "</parameter>"


def parse_minimax_m2(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a section that starts with `<minimax:tool_call>`."""
    calls = []
    for begin, end, is_closed in spans(section, OPEN, CLOSE, 0, len(section), False):
        invokes = spans(section, INVOKE_OPEN, INVOKE_CLOSE, begin, end, False)
        if not is_closed or not invokes or not all(closed for _, _, closed in invokes):
            return None
        for at, stop, _ in invokes:
            call = _call(section, at, stop, tools, is_closed=True)
            if call.name is None or call.name not in tools.names or call.arguments is None:
                return None
            calls.append(make_call(openai_call_id(), call.name, call.arguments))
    return calls or None


def _call(text: str, begin: int, end: int, tools: ToolSchemas, *, is_closed: bool) -> CallSoFar:
    """The invoke whose name starts at `begin`, read up to `end`: its parameters written so
    far (all of them, closed, when `is_closed`)."""
    gt = text.find(">", begin, end)
    if gt < 0:
        return CallSoFar(None)
    name = _unquoted(text[begin:gt])
    if name not in tools.names:
        return CallSoFar(name)
    props = tools.properties(name)
    members = []
    for at, stop, closed in spans(text, PARAM_OPEN, PARAM_CLOSE, gt + 1, end, False):
        key_end = text.find(">", at, stop)
        if not closed or key_end < 0:
            break  # still being written (or malformed: the whole parse has it as text)
        key = _unquoted(text[at:key_end])
        value = typed_value(text[key_end + 1 : stop].strip(), props.get(key))
        key_json, value_json = (
            json.dumps(key, ensure_ascii=False),
            json.dumps(value, ensure_ascii=False),
        )
        members.append(f"{key_json}: {value_json}")
    return CallSoFar(name, members_so_far(members, is_closed))


def _unquoted(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        return name[1:-1]
    return name


MINIMAX_M2 = CallFormat((OPEN,), parse_minimax_m2)


class MiniMaxM2Reader:
    """MiniMax-M2's calls read as they are written (a tool_reader.CallReader)."""

    def __init__(self, tools: ToolSchemas) -> None:
        self._tools = tools

    def call_id(self) -> str:
        return openai_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        calls = []
        for begin, end, _ in spans(text, OPEN, CLOSE, start, len(text), is_final):
            for at, stop, closed in spans(text, INVOKE_OPEN, INVOKE_CLOSE, begin, end, False):
                calls.append(_call(text, at, stop, self._tools, is_closed=closed))
        return SectionSoFar(tuple(calls))
