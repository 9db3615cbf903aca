"""tool_choice "auto" for Mistral models (vLLM's `--tool-call-parser mistral`).

Mistral's calls follow a `[TOOL_CALLS]` token (kept in the text: the tokenizer must not skip
it), in one of two forms:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]    7B v0.3, Nemo
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}      Small 3.2+

(the second also as `name[CALL_ID]id[ARGS]{...}` or `name{...}`). Text before the first
`[TOOL_CALLS]` is the content. Every call must name a known tool with a JSON object of
arguments, or none is a call and the reply is its text (vLLM also drops the `[TOOL_CALLS]`
tokens from that text and strips it; troupe keeps the text as written, as its other parsers
do, so that a streamed reply, whose start went out as it came, reads the same). Arguments are
re-serialized as vLLM's
(`json.dumps`, non-ASCII kept); ids are 9 letters and digits, as Mistral's API requires.
Streamed (`MistralReader`), each call's arguments go out as the JSON object the model writes.
"""

from __future__ import annotations

import json
import random
import re
import string
from typing import Any

from troupe.actors.core.marker_tail import marker_tail
from troupe.gateway.json_scan import ObjectScan, object_at, object_call
from troupe.gateway.tool_format import CallFormat, ToolCallDict, ToolSchemas, make_call
from troupe.gateway.tool_reader import CallSoFar, SectionSoFar

BOT, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_ALPHANUMERIC = string.ascii_letters + string.digits
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_ARRAY = re.compile(r"\[\s*\{.*\}\s*\]", re.DOTALL)  # vLLM's fallback: the array in the text
_decoder = json.JSONDecoder()
_SPACES = re.compile(r"\s*")


def mistral_call_id() -> str:
    """9 random letters and digits (mistral_common refuses other tool-call ids)."""
    return "".join(random.choices(_ALPHANUMERIC, k=9))


def parse_mistral(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a section that starts with `[TOOL_CALLS]`; None if it is not calls."""
    body = section.replace(BOT, "").strip()
    if body.startswith("["):
        pairs = _array_calls(body)
    else:
        pairs = _named_calls(section)
    if not pairs or any(name not in tools.names for name, _ in pairs):
        return None
    return [
        make_call(mistral_call_id(), name, json.dumps(args, ensure_ascii=False))
        for name, args in pairs
    ]


def _array_calls(body: str) -> list[tuple[str, dict[str, Any]]] | None:
    """[{"name", "arguments"}, ...]; text around the array is dropped, as vLLM's fallback."""
    try:
        value = json.loads(body)
    except ValueError:
        found = _ARRAY.search(body)
        if found is None:
            return None
        try:
            value = json.loads(found.group())
        except ValueError:
            return None
    return array_pairs(value)


def array_pairs(value: Any) -> list[tuple[str, dict[str, Any]]] | None:
    """(name, arguments) of a decoded [{"name", "arguments"?}, ...] (Mistral's and Granite's
    arrays); None if it is not one."""
    if not isinstance(value, list):
        return None
    pairs = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = item.get("arguments", {})
        if not isinstance(args, dict):
            return None
        pairs.append((item["name"], args))
    return pairs


def _named_calls(section: str) -> list[tuple[str, dict[str, Any]]] | None:
    """name[ARGS]{...} (or name[CALL_ID]id[ARGS]{...}, or name{...}) after each marker."""
    pairs = []
    for segment in section.split(BOT)[1:]:
        if ARGS in segment:
            head, _, rest = segment.partition(ARGS)
            name = head.partition(CALL_ID)[0].strip()
        else:
            brace = segment.find("{")
            if brace < 0:
                return None
            name, rest = segment[:brace].strip(), segment[brace:]
        if not _NAME.fullmatch(name):
            return None
        rest = rest.lstrip()
        try:
            args, end = _decoder.raw_decode(rest)
        except ValueError:
            return None
        if not isinstance(args, dict) or rest[end:].strip():
            return None
        pairs.append((name, args))
    return pairs


MISTRAL = CallFormat((BOT,), parse_mistral)


class MistralReader:
    """Mistral's calls read as they are written (a tool_reader.CallReader), in either form:
    the array's objects one by one, or each `[TOOL_CALLS]` segment's name and JSON object."""

    def __init__(self) -> None:
        self._scans: dict[int, ObjectScan] = {}  # by where an object begins

    def call_id(self) -> str:
        return mistral_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        at = _skip(text, start + len(BOT))
        if at >= len(text):
            return SectionSoFar(())
        if text[at] == "[":
            return SectionSoFar(array_objects_so_far(text, at + 1, self._scans))
        return SectionSoFar(self._named(text, start))

    def _named(self, text: str, at: int) -> tuple[CallSoFar, ...]:
        calls = []
        while at >= 0:  # a [TOOL_CALLS] begins here
            segment = at + len(BOT)
            at = text.find(BOT, segment)
            end = at if at >= 0 else len(text) - marker_tail(text, (BOT,), segment)
            calls.append(self._segment(text, segment, end))
        return tuple(calls)

    def _segment(self, text: str, segment: int, end: int) -> CallSoFar:
        """name[ARGS]{...}, name[CALL_ID]id[ARGS]{...} or name{...}, as far as written."""
        args = text.find(ARGS, segment, end)
        if args >= 0:
            name = text[segment:args].partition(CALL_ID)[0].strip()
            body = _skip(text, args + len(ARGS))
        else:
            body = text.find("{", segment, end)
            if body < 0 or "[" in text[segment:body]:  # [ARGS] may be on its way
                return CallSoFar(None)
            name = text[segment:body].strip()
        if not _NAME.fullmatch(name):
            return CallSoFar(None)
        if body >= end:  # no argument written yet
            return CallSoFar(name)
        return CallSoFar(name, object_at(self._scans, text, body, end))


def array_objects_so_far(text: str, at: int, scans: dict[int, ObjectScan]) -> tuple[CallSoFar, ...]:
    """The {"name", "arguments"} objects of an array whose first item begins at or after
    `at`, as far as written (`scans`: the reader's, by where an object begins)."""
    calls = []
    while True:
        at = _skip(text, at)
        if not text.startswith("{", at):
            break
        scan = scans.setdefault(at, ObjectScan(at))
        calls.append(object_call(text, scan, len(text), is_object_only=True))
        if scan.end is None:
            break
        at = _skip(text, scan.end)
        if not text.startswith(",", at):
            break
        at += 1
    return tuple(calls)


def _skip(text: str, at: int) -> int:
    return _SPACES.match(text, at).end()  # type: ignore[union-attr]
