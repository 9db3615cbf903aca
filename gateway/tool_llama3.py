"""tool_choice "auto" for Llama 3.x (vLLM's `--tool-call-parser llama3_json`).

Llama 3.1/3.2/3.3 Instruct answer a tool call with JSON, sometimes after `<|python_tag|>`,
several calls joined by `; `:

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", ...}

A reply is calls when it starts (after whitespace) with `{` or `<|python_tag|>` and the rest
is nothing but such objects, each naming a known tool with its `arguments` (or Llama's
`parameters`); then it has no content, as vLLM answers. Anything else, a malformed object
included, is plain text. vLLM's whole-reply parser also takes JSON found after some text, but
its streamed one only a reply that starts with `{` or the tag; troupe keeps the streamed rule
for both, so that a reply reads the same whole and streamed. Streaming sends a reply that
cannot be calls as it comes and holds one that may be until the end; chat streams each call as
it is written (`Llama3Reader`): the name, then its `arguments` (or `parameters`) JSON as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from troupe.gateway.json_scan import ObjectScan, object_call
from troupe.gateway.tool_reader import CallSoFar, SectionSoFar, openai_call_id

BOT = "<|python_tag|>"
_decoder = json.JSONDecoder()
_SPACES = re.compile(r"\s*")


def parse_llama3_calls(text: str, names: Iterable[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI `tool_calls`) of a reply; no calls: the whole text is the content."""
    body = text.lstrip()
    if body.startswith(BOT):
        body = body[len(BOT) :]
    elif not body.startswith("{"):
        return text, []
    known = set(names)
    calls = []
    at = _skip_space(body, 0)
    while at < len(body):
        try:
            obj, at = _decoder.raw_decode(body, at)
        except ValueError:
            return text, []
        call = _call(obj, known)
        if call is None:
            return text, []
        calls.append(call)
        at = _skip_space(body, at)
        if at < len(body):
            if body[at] != ";":
                return text, []
            at = _skip_space(body, at + 1)  # a trailing `;` ends the list too
    return (None, calls) if calls else (text, [])


def _skip_space(text: str, at: int) -> int:
    return len(text) - len(text[at:].lstrip())


def _call(obj: object, known: set[str]) -> dict[str, Any] | None:
    """One OpenAI tool call from {"name", "arguments" | "parameters"}; None if it is not one."""
    if not isinstance(obj, dict) or obj.get("name") not in known:
        return None
    if "arguments" in obj:
        arguments = obj["arguments"]
    elif "parameters" in obj:
        arguments = obj["parameters"]
    else:
        return None
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": openai_call_id(),
        "type": "function",
        "function": {"name": obj["name"], "arguments": arguments},
    }


class Llama3ToolStream:
    """One streamed reply: content as it comes once the reply cannot be calls; else the
    calls (or, if they do not parse, the text) at the end."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self.text = ""
        self._sent = 0  # text[:_sent] went out as content
        self._is_call: bool | None = None  # None: too early to say

    @property
    def held_from(self) -> int | None:
        return 0 if self._is_call else None

    def delta(self, piece: str) -> str:
        """The content of `piece` that can go out now."""
        self.text += piece
        if self._is_call is None:
            head = self.text.lstrip()
            if BOT.startswith(head):  # nothing yet, or the tag's beginning
                return ""
            self._is_call = head.startswith(("{", BOT))
        if self._is_call:
            return ""
        out, self._sent = self.text[self._sent :], len(self.text)
        return out

    def finish(self, stopped: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content not sent yet, calls): the calls only when the reply ended by itself."""
        rest = self.text[self._sent :]
        if not stopped or self._sent:
            return rest, []
        content, calls = parse_llama3_calls(rest, self.names)
        return (content or "", calls) if calls else (rest, [])


class Llama3Reader:
    """`;`-joined call objects read as they are written (a tool_reader.CallReader)."""

    def __init__(self) -> None:
        self._scans: dict[int, ObjectScan] = {}  # by where an object begins

    def call_id(self) -> str:
        return openai_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        calls: list[CallSoFar] = []
        at = _SPACES.match(text, start).end()  # type: ignore[union-attr]
        if text.startswith(BOT, at):
            at += len(BOT)
        while True:
            at = _SPACES.match(text, at).end()  # type: ignore[union-attr]
            if not text.startswith("{", at):
                break
            scan = self._scans.setdefault(at, ObjectScan(at))
            keys = ("arguments", "parameters")  # as the whole parse, "arguments" first
            calls.append(object_call(text, scan, len(text), keys, default=None))
            if scan.end is None:
                break
            at = _SPACES.match(text, scan.end).end()  # type: ignore[union-attr]
            if not text.startswith(";", at):
                break
            at += 1
        return SectionSoFar(tuple(calls))
