"""tool_choice "auto" for GPT-OSS (vLLM's `--tool-call-parser openai`, with `--reasoning-parser
openai_gptoss`): the harmony parser (gateway/harmony.py) keeps each message the model addresses
to `functions.NAME` in the content, written as GPT-OSS's chat template writes a call,

    Let me look that up.<|start|>assistant to=functions.get_weather<|channel|>commentary
    json<|message|>{"city": "Paris"}<|call|>

(one line), whichever header form the model used; the content before the first call is the
reply's content (a preamble), what follows the calls is dropped. A call must name a known tool
and its arguments be a JSON object, passed on as written (less surrounding whitespace);
otherwise the reply is text. Ids are vLLM's (`chatcmpl-tool-` and 32 hex digits). Streamed
(`OpenAIReader`), a call opens once its `<|message|>` is written, and its object goes out as
written.
"""

from __future__ import annotations

from troupe.gateway.harmony import CALL_END, CALL_OPEN, CHANNEL, MESSAGE
from troupe.gateway.tool_format import (
    CallFormat,
    TaggedObjectReader,
    ToolCallDict,
    ToolSchemas,
    delimited_calls,
    json_object_call,
    vllm_call_id,
)


def parse_openai(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a section that starts with a kept call's header."""
    return delimited_calls(section, CALL_OPEN, CALL_END, lambda inner: _call(inner, tools))


def _call(inner: str, tools: ToolSchemas) -> ToolCallDict | None:
    """`NAME<|channel|>commentary json<|message|>{...}` as one call."""
    head, sep, arguments = inner.partition(MESSAGE)
    if not sep:
        return None
    name = head.partition(CHANNEL)[0]
    return json_object_call(vllm_call_id(), name, arguments.strip(), tools)


OPENAI = CallFormat((CALL_OPEN,), parse_openai)


class OpenAIReader(TaggedObjectReader):
    """GPT-OSS's calls read as they are written (a tool_reader.CallReader)."""

    open_tag, close_tag = CALL_OPEN, CALL_END

    def head(self, text: str, inner: int, end: int) -> tuple[str, int, str | None] | None:
        sep = text.find(MESSAGE, inner, end)
        if sep < 0:
            return None
        return text[inner:sep].partition(CHANNEL)[0], sep + len(MESSAGE), None
