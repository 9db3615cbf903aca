"""tool_choice "auto" for Zhipu's GLM-4.5/4.6/4.7 (vLLM's `--tool-call-parser glm45`):

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

(GLM-4.7 leaves out the newlines: `<tool_call>get_weather<arg_key>city</arg_key>...`.) Text
before the first `<tool_call>` is the content; text between and after the calls is dropped,
as vLLM does. The name runs to the first newline or `<arg_key>`; keys and values lose their
surrounding whitespace. A value whose parameter the tool's schema types "string" stays as
written; any other is JSON if it parses as JSON, else a Python literal, else the text (vLLM's
rule; a value with no JSON form, a set or nan, stays text). Every call must be closed and name
a known tool, or the reply is text. Ids are vLLM's (`chatcmpl-tool-` and 32 hex digits).
Streamed (`Glm45Reader`), a call opens once its name is whole and each argument's
`"key": value` goes out once its `</arg_value>` is written, so the pieces put together are the
whole parse's `json.dumps` text.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from troupe.gateway.tool_format import (
    CallFormat,
    ToolCallDict,
    ToolSchemas,
    delimited_calls,
    make_call,
    vllm_call_id,
)
from troupe.gateway.tool_reader import CallSoFar, SectionSoFar, members_so_far, spans

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"


def parse_glm45(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a section that starts with `<tool_call>`."""
    return delimited_calls(section, OPEN, CLOSE, lambda inner: _call(inner, tools))


def _call(inner: str, tools: ToolSchemas) -> ToolCallDict | None:
    """`name` and its closed pairs, as one call."""
    name, args_at = _name(inner, 0, len(inner), is_closed=True)
    if name is None or name not in tools.names:
        return None
    props = tools.properties(name)
    pairs = _pairs(inner, args_at, len(inner))
    args = {key: _typed(raw, props.get(key)) for key, raw in pairs}
    return make_call(vllm_call_id(), name, json.dumps(args, ensure_ascii=False))


def _name(text: str, body: int, end: int, *, is_closed: bool) -> tuple[str | None, int]:
    """(the call's name, where its arguments begin), or (None, body) while it may grow: it
    runs to a newline, an `<arg_key>` or the call's end."""
    stops = [s for tag in ("\n", KEY_OPEN) if (s := text.find(tag, body, end)) >= 0]
    stop = min(stops, default=end if is_closed else -1)
    if stop < 0:
        return None, body
    return text[body:stop].strip(), stop


def _pairs(text: str, start: int, end: int) -> list[tuple[str, str]]:
    """(key, raw value) of each closed `<arg_key>k</arg_key><arg_value>v</arg_value>` in
    text[start:end]: the pairs written so far, a pair still open left out."""
    out = []
    at = text.find(KEY_OPEN, start, end)
    while at >= 0:
        key_end = text.find(KEY_CLOSE, at, end)
        value_at = text.find(VALUE_OPEN, key_end, end) if key_end >= 0 else -1
        value_end = text.find(VALUE_CLOSE, value_at, end) if value_at >= 0 else -1
        if value_end < 0:
            break
        key = text[at + len(KEY_OPEN) : key_end].strip()
        out.append((key, text[value_at + len(VALUE_OPEN) : value_end].strip()))
        at = text.find(KEY_OPEN, value_end, end)
    return out


def _typed(raw: str, schema: Any) -> Any:
    """A value as its parameter's schema reads it (see the module docstring)."""
    if isinstance(schema, dict) and schema.get("type") == "string":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return raw
    return value


GLM45 = CallFormat((OPEN,), parse_glm45)


class Glm45Reader:
    """GLM-4.5's calls read as they are written (a tool_reader.CallReader)."""

    def __init__(self, tools: ToolSchemas) -> None:
        self._tools = tools

    def call_id(self) -> str:
        return vllm_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        found = spans(text, OPEN, CLOSE, start, len(text), False)
        return SectionSoFar(tuple(self._call(text, *span) for span in found))

    def _call(self, text: str, body: int, end: int, is_closed: bool) -> CallSoFar:
        name, args_at = _name(text, body, end, is_closed=is_closed)
        if name is None or name not in self._tools.names:
            return CallSoFar(name)
        props = self._tools.properties(name)
        members = [
            f"{json.dumps(key, ensure_ascii=False)}: "
            f"{json.dumps(_typed(raw, props.get(key)), ensure_ascii=False)}"
            for key, raw in _pairs(text, args_at, end)
        ]
        return CallSoFar(name, members_so_far(members, is_closed))
