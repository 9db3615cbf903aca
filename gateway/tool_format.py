"""One tool-call format read the same way whole and streamed: the reply is content up to the
first of the format's markers, and from there a call section that is parsed when the reply
ends (all its calls, or none: then the whole reply is its text, as vLLM's parsers answer).

    "Sure. [TOOL_CALLS][{...}]"         content "Sure. ", the section "[TOOL_CALLS][{...}]"
     ^^^^^^ streamed as it comes        ^ held from here to the end, then parsed

A format whose calls must lead the reply (`lead_only`, Llama's pythonic lists) is content
unless the reply, after leading whitespace, starts with a marker; that whitespace is dropped
before calls. Streaming sends content as soon as it cannot be (the start of) a marker, and
holds nothing else, so the concatenated deltas always equal the whole reply's parse. Chat
then reads the held section as it grows with the format's `tool_reader.CallReader`
(gateway/tool_stream.py), so each call goes out as it is written.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from troupe.actors.core.marker_tail import marker_tail
from troupe.gateway.json_scan import ObjectScan, object_at
from troupe.gateway.tool_reader import CallSoFar, SectionSoFar, spans

ToolCallDict = dict[str, Any]  # OpenAI's {"id", "type": "function", "function": {...}}


@dataclasses.dataclass(frozen=True)
class ToolSchemas:
    """The request's tools as the client sent them: names, and each one's parameters."""

    tools: tuple[dict[str, Any], ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t["function"]["name"] for t in self.tools)

    def properties(self, name: str) -> dict[str, Any]:
        """The JSON-schema `properties` of tool `name`'s parameters ({} when it has none)."""
        for tool in self.tools:
            function = tool["function"]
            if function["name"] == name:
                params = function.get("parameters") or {}
                props = params.get("properties") if isinstance(params, dict) else None
                return props if isinstance(props, dict) else {}
        return {}


def vllm_call_id() -> str:
    """vLLM's default tool-call id (`chatcmpl-tool-` and 32 hex digits)."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def make_call(call_id: str, name: str, arguments: str) -> ToolCallDict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclasses.dataclass(frozen=True)
class CallFormat:
    """A format: the markers that open its call section, and how a section parses.

    `parse(section, tools)` gives the calls, or None when the section is not calls (bad
    JSON, an unknown tool, no call at all)."""

    markers: tuple[str, ...]
    parse: Callable[[str, ToolSchemas], list[ToolCallDict] | None]
    lead_only: bool = False

    def find(self, text: str, start: int = 0) -> int:
        """Where the call section begins at or after `start` (-1: nowhere)."""
        if self.lead_only:
            head = text.lstrip()
            opens = start == 0 and head.startswith(self.markers)
            return len(text) - len(head) if opens else -1
        found = [at for m in self.markers if (at := text.find(m, start)) >= 0]
        return min(found, default=-1)

    def marker_prefix(self, text: str) -> int:
        """Length of the longest tail of `text` that may begin a marker (held back); for a
        `lead_only` format, all of `text` while it may still open with one."""
        if self.lead_only:
            head = text.lstrip()
            return len(text) if any(m.startswith(head) for m in self.markers) else 0
        return marker_tail(text, self.markers)


def delimited_calls(
    section: str, begin: str, end: str, parse_one: Callable[[str], ToolCallDict | None]
) -> list[ToolCallDict] | None:
    """Each `begin` ... `end` body in `section` parsed as one call: all of them, or None when
    one is left open or does not parse (then the reply is text), or there is none."""
    calls = []
    for start, stop, is_closed in spans(section, begin, end, 0, len(section), False):
        call = parse_one(section[start:stop]) if is_closed else None
        if call is None:
            return None
        calls.append(call)
    return calls or None


def json_object_call(
    call_id: str, name: str, arguments: str, tools: ToolSchemas
) -> ToolCallDict | None:
    """A call of the request's tool `name` whose arguments text is a JSON object, passed on as
    written (None: an unknown tool, or arguments that are no JSON object)."""
    if name not in tools.names:
        return None
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return make_call(call_id, name, arguments) if isinstance(value, dict) else None


def parse_reply(
    fmt: CallFormat, text: str, tools: ToolSchemas
) -> tuple[str | None, list[ToolCallDict]]:
    """(content, OpenAI `tool_calls`) of a whole reply; no calls: the content is the text."""
    at = fmt.find(text)
    if at < 0:
        return text, []
    calls = fmt.parse(text[at:], tools)
    if not calls:
        return text, []
    before = "" if fmt.lead_only else text[:at]
    return (before or None), calls


class FormatCallStream:
    """One streamed reply in `fmt`: content to send now, and at the end the calls (or the
    held section as text). Implements tool_auto.AutoCallStream."""

    def __init__(self, fmt: CallFormat, tools: Sequence[dict[str, Any]]) -> None:
        self.fmt = fmt
        self.tools = ToolSchemas(tuple(tools))
        self.text = ""
        self._sent = 0  # text[:_sent] went out as content
        self._at = -1  # where the call section began (-1: not yet)
        self._decided = False  # lead_only: the reply is known to be content

    @property
    def held_from(self) -> int | None:
        return self._at if self._at >= 0 else None

    def delta(self, piece: str) -> str:
        """The content of `piece` (and of what was held) that can go out now."""
        self.text += piece
        if self._at >= 0:
            return ""
        if self.fmt.lead_only and not self._decided:
            self._at = self.fmt.find(self.text)
            if self._at >= 0 or not self.text.strip() or self.fmt.marker_prefix(self.text):
                return ""  # calls, or too early to say
            self._decided = True
            end = len(self.text)
        elif self.fmt.lead_only:
            end = len(self.text)
        else:
            self._at = self.fmt.find(self.text, self._sent)
            if self._at >= 0:
                end = self._at
            else:
                end = len(self.text) - self.fmt.marker_prefix(self.text[self._sent :])
        out, self._sent = self.text[self._sent : end], end
        return out

    def finish(self, stopped: bool) -> tuple[str, list[ToolCallDict]]:
        """(content not sent yet, calls): the calls only when the reply ended by itself."""
        rest = self.text[self._sent :]
        if self._at < 0 or not stopped:
            return rest, []
        calls = self.fmt.parse(self.text[self._at :], self.tools)
        return ("", calls) if calls else (rest, [])


class TaggedObjectReader:
    """A tool_reader.CallReader for a format whose calls each sit between `open_tag` and
    `close_tag`, their arguments one JSON object that goes out as written (kimi_k2,
    deepseek_v3, openai): a subclass's `head` finds a call's name and where its object begins."""

    open_tag = ""
    close_tag = ""

    def __init__(self) -> None:
        self._scans: dict[int, ObjectScan] = {}  # by where a call's arguments begin

    def call_id(self) -> str:
        return vllm_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        found = spans(text, self.open_tag, self.close_tag, start, len(text), False)
        return SectionSoFar(tuple(self._call(text, begin, end) for begin, end, _ in found))

    def head(self, text: str, inner: int, end: int) -> tuple[str, int, str | None] | None:
        """(the name, where the object begins, the id the model wrote or None) of the call
        written in text[inner:end] so far; None while that is not known."""
        raise NotImplementedError

    def _call(self, text: str, inner: int, end: int) -> CallSoFar:
        found = self.head(text, inner, end)
        if found is None:
            return CallSoFar(None)
        name, body, call_id = found
        return CallSoFar(name, object_at(self._scans, text, body, end), call_id=call_id)
