"""tool_choice "auto" for IBM Granite 3.x (vLLM's `--tool-call-parser granite`): a reply that
calls tools opens (after whitespace) with `<|tool_call|>` (Granite 3.0), `<tool_call>` (3.1
on) or straight with the array, and is one JSON array of calls:

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]

As vLLM's parser, only the reply's start is looked at, and a reply of calls has no content.
Each call must name a known tool with a JSON object of arguments (or none: {}), or the reply is
its text. Arguments are re-serialized as vLLM's (`json.dumps`, non-ASCII kept); ids are
vLLM's. Streamed (`GraniteReader`), each object of the array goes out as it is written.
"""

from __future__ import annotations

import json

from troupe.gateway.json_scan import ObjectScan
from troupe.gateway.tool_format import (
    CallFormat,
    ToolCallDict,
    ToolSchemas,
    make_call,
    vllm_call_id,
)
from troupe.gateway.tool_mistral import array_objects_so_far, array_pairs
from troupe.gateway.tool_reader import SectionSoFar

TAGS = ("<|tool_call|>", "<tool_call>")
_decoder = json.JSONDecoder()


def parse_granite(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a reply that opens with a tag or `[`; None if it is not calls."""
    body = _after_tag(section.strip())
    if not body.startswith("["):
        return None
    try:
        value, end = _decoder.raw_decode(body)
    except ValueError:
        return None
    pairs = array_pairs(value)
    if not pairs or body[end:].strip() or any(name not in tools.names for name, _ in pairs):
        return None
    return [
        make_call(vllm_call_id(), name, json.dumps(args, ensure_ascii=False))
        for name, args in pairs
    ]


def _after_tag(text: str, tags: tuple[str, ...] = TAGS) -> str:
    for tag in tags:
        if text.startswith(tag):
            return text[len(tag) :].lstrip()
    return text


GRANITE = CallFormat((*TAGS, "["), parse_granite, lead_only=True)


class GraniteReader:
    """Granite's array read as it is written (a tool_reader.CallReader); `tags`: those that
    may lead it (Hunyuan's one, gateway/tool_hunyuan.py)."""

    def __init__(self, tags: tuple[str, ...] = TAGS) -> None:
        self._scans: dict[int, ObjectScan] = {}  # by where an object begins
        self._tags = tags

    def call_id(self) -> str:
        return vllm_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        head = text[start:]
        rest = _after_tag(head.lstrip(), self._tags)
        at = len(text) - len(rest)
        if not rest.startswith("["):
            return SectionSoFar(())
        return SectionSoFar(array_objects_so_far(text, at + 1, self._scans))
