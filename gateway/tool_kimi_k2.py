"""tool_choice "auto" for Moonshot's Kimi K2 (vLLM's `--tool-call-parser kimi_k2`):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>
    <|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>
    <|tool_calls_section_end|>

Text before `<|tool_calls_section_begin|>` is the content; what follows the calls is dropped,
as vLLM does. Each call's id is the one the model wrote (`functions.get_weather:0`: Kimi's
template writes it back into the next turn, so it must survive the round trip), and its name
is that id's part after the last `.` before the `:` (vLLM's rule). The call must name a known
tool and its arguments be a JSON object, passed on as written (less surrounding whitespace);
otherwise, or when a call is left open, the reply is text. Streamed (`KimiK2Reader`), a call
opens once its arguments' `{` is written, and the object goes out as written.
"""

from __future__ import annotations

import re

from troupe.gateway.tool_format import (
    CallFormat,
    TaggedObjectReader,
    ToolCallDict,
    ToolSchemas,
    delimited_calls,
    json_object_call,
)

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
_ID = re.compile(r"[^<]+:\d+")  # `functions.name:index` or `name:index`


def call_name(call_id: str) -> str | None:
    """The function a Kimi call id names (None: not an id)."""
    if not _ID.fullmatch(call_id):
        return None
    return call_id.rpartition(":")[0].split(".")[-1]


def parse_kimi_k2(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a section that starts with `<|tool_calls_section_begin|>`."""
    return delimited_calls(section, CALL_BEGIN, CALL_END, lambda inner: _call(inner, tools))


def _call(inner: str, tools: ToolSchemas) -> ToolCallDict | None:
    """`id<|tool_call_argument_begin|>{...}` as one call."""
    call_id, sep, arguments = inner.partition(ARGUMENT_BEGIN)
    name = call_name(call_id := call_id.strip())
    if not sep or name is None:
        return None
    return json_object_call(call_id, name, arguments.strip(), tools)


KIMI_K2 = CallFormat((SECTION_BEGIN,), parse_kimi_k2)


class KimiK2Reader(TaggedObjectReader):
    """Kimi K2's calls read as they are written (a tool_reader.CallReader; every call carries
    the model's own id, so `call_id` is never asked)."""

    open_tag, close_tag = CALL_BEGIN, CALL_END

    def head(self, text: str, inner: int, end: int) -> tuple[str, int, str | None] | None:
        sep = text.find(ARGUMENT_BEGIN, inner, end)
        if sep < 0:
            return None
        call_id = text[inner:sep].strip()
        name = call_name(call_id)
        return None if name is None else (name, sep + len(ARGUMENT_BEGIN), call_id)
