"""tool_choice "auto" for Qwen3-Coder's XML calls (vLLM's `--tool-call-parser qwen3_coder`):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Text before the first `<tool_call>` (or `<function=`, when the model leaves the wrapper out)
is the content; what follows the calls is dropped, as vLLM does. As vLLM's, the parse is
lenient where the model stopped: a last `</parameter>`, `</function>` or `</tool_call>` left
out still closes. Each value loses one newline at each end and is typed by the tool's JSON
schema: integers and numbers parsed (an integral number as an int), booleans from
`true`/`false`, objects and arrays as JSON (or a Python literal), `null` as null, strings and
parameters the schema does not list as they are; a value that does not parse as its type
stays a string. A function no tool names makes the reply text. Ids are `call_` and 24 hex
digits, as vLLM's. Streamed (`Qwen3CoderReader`), a call opens at its `<function=name>` and
each parameter's `"key": value` goes out once the parameter closes, so the pieces put
together are the whole parse's `json.dumps` text.

Seed-OSS writes the same calls inside `<seed:tool_call>` ... `</seed:tool_call>` (vLLM's
`--tool-call-parser seed_oss`): `SEED_OSS`, and the reader made with `SEED_WRAPPER`.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from troupe.gateway.tool_format import CallFormat, ToolCallDict, ToolSchemas, make_call
from troupe.gateway.tool_reader import (
    CallSoFar,
    SectionSoFar,
    members_so_far,
    openai_call_id,
    spans,
)

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
FUNC_OPEN, FUNC_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
QWEN3_WRAPPER = (TOOL_OPEN, TOOL_CLOSE)
SEED_WRAPPER = ("<seed:tool_call>", "</seed:tool_call>")  # Seed-OSS's


def parse_qwen3_coder(
    section: str, tools: ToolSchemas, wrapper: tuple[str, str] = QWEN3_WRAPPER
) -> list[ToolCallDict] | None:
    """The calls of a section that starts with the wrapper's tag or `<function=`."""
    blocks = _between(section, *wrapper) or [section]
    functions = [f for block in blocks for f in _between(block, FUNC_OPEN, FUNC_CLOSE)]
    calls = []
    for function in functions:
        name, sep, body = function.partition(">")
        if not sep or name not in tools.names:
            return None
        props = tools.properties(name)
        args = {key: typed_value(raw, props.get(key)) for key, raw in _parameters(body)}
        arguments = json.dumps(args, ensure_ascii=False)
        calls.append(make_call(openai_call_id(), name, arguments))
    return calls or None


def _between(text: str, open_tag: str, close_tag: str) -> list[str]:
    """The texts after each `open_tag` up to its `close_tag` (or the end, if it has none)."""
    out = []
    at = text.find(open_tag)
    while at >= 0:
        start = at + len(open_tag)
        end = text.find(close_tag, start)
        if end < 0:
            out.append(text[start:])
            break
        out.append(text[start:end])
        at = text.find(open_tag, end + len(close_tag))
    return out


def _parameters(body: str) -> list[tuple[str, str]]:
    """(name, raw value) of each `<parameter=name>value</parameter>`; a value left open ends
    at the next parameter or at the end."""
    out = []
    at = body.find(PARAM_OPEN)
    while at >= 0:
        start = at + len(PARAM_OPEN)
        ends = [e for tag in (PARAM_CLOSE, PARAM_OPEN) if (e := body.find(tag, start)) >= 0]
        end = min(ends, default=len(body))
        name, _, value = body[start:end].partition(">")
        value = value.removeprefix("\n").removesuffix("\n")
        out.append((name, value))
        at = body.find(PARAM_OPEN, end)
    return out


def typed_value(raw: str, schema: Any) -> Any:
    """A parameter's text as the JSON value its schema's `type` asks for (see the module);
    the text itself where the value has no JSON form (nan, a set, bytes)."""
    value = _typed(raw, schema)
    return value if _is_json(value) else raw


def _typed(raw: str, schema: Any) -> Any:
    if raw.lower() == "null":
        return None
    kind = _type_of(schema)
    if kind in ("string", "str", "text", "varchar", "char", "enum"):
        return raw
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(raw)
        except ValueError:
            return raw
    if kind.startswith(("num", "float")):
        try:
            number = float(raw)
        except ValueError:
            return raw
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return raw.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(raw)
        except ValueError:
            pass
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def _type_of(schema: Any) -> str:
    """The schema's type, lower case ("string" when it names none; the first that is not
    "null" of a list of types)."""
    if not isinstance(schema, dict) or "type" not in schema:
        return "string"
    kind = schema["type"]
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return str(kind).strip().lower()


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _parse_seed_oss(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    return parse_qwen3_coder(section, tools, SEED_WRAPPER)


QWEN3_CODER = CallFormat((TOOL_OPEN, FUNC_OPEN), parse_qwen3_coder)
SEED_OSS = CallFormat((SEED_WRAPPER[0], FUNC_OPEN), _parse_seed_oss)


class Qwen3CoderReader:
    """Qwen3-Coder's calls (Seed-OSS's with its wrapper) read as they are written (a
    tool_reader.CallReader): the blocks and functions cut as the whole parse cuts them, each
    closed parameter typed once."""

    def __init__(self, tools: ToolSchemas, wrapper: tuple[str, str] = QWEN3_WRAPPER) -> None:
        self._tools = tools
        self._wrapper = wrapper
        self._members: dict[tuple[int, int], str] = {}  # a parameter's span -> its JSON member

    def call_id(self) -> str:
        return openai_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        opening, closing = self._wrapper
        if text.startswith(opening, start):
            blocks = spans(text, opening, closing, start, len(text), is_final)
        else:
            blocks = [(start, len(text), is_final)]
        calls = []
        for begin, end, is_closed in blocks:
            for function in spans(text, FUNC_OPEN, FUNC_CLOSE, begin, end, is_closed):
                calls.append(self._function(text, *function))
        return SectionSoFar(tuple(calls))

    def _function(self, text: str, begin: int, end: int, is_closed: bool) -> CallSoFar:
        gt = text.find(">", begin, end)
        if gt < 0:
            return CallSoFar(None)
        name = text[begin:gt]
        if name not in self._tools.names:
            return CallSoFar(name)
        members = []
        at = text.find(PARAM_OPEN, gt + 1, end)
        while at >= 0:
            value = at + len(PARAM_OPEN)
            ends = [
                e for tag in (PARAM_CLOSE, PARAM_OPEN) if (e := text.find(tag, value, end)) >= 0
            ]
            if not ends and not is_closed:
                break  # this parameter is still being written
            stop = min(ends, default=end)
            members.append(self._member(text, value, stop, name))
            at = text.find(PARAM_OPEN, stop, end)
        return CallSoFar(name, members_so_far(members, is_closed))

    def _member(self, text: str, start: int, end: int, function: str) -> str:
        member = self._members.get((start, end))
        if member is None:
            key, _, raw = text[start:end].partition(">")
            value = typed_value(
                raw.removeprefix("\n").removesuffix("\n"), self._tools.properties(function).get(key)
            )
            member = (
                f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
            )
            self._members[(start, end)] = member
        return member
