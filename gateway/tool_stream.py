"""tool_choice "auto" streamed as the model writes: content as it comes, each call's id and
name once its name is whole, then its arguments' JSON text in pieces (as vLLM's tool parsers
stream; chat_tool_chunks.py turns the pieces into chunks).

    reply   Sure. <tool_call>{"name": "f", "arguments": {"a": 1, "b": 2}}</tool_call>
    pieces  ContentPiece("Sure. ")  CallOpened(0, id, "f")
            ArgumentsPiece(0, '{"a": 1')  ArgumentsPiece(0, ', "b": 2}')   (as tokens come)

The format's AutoCallStream (tool_auto.py) says, as before, what is content and where the call
section begins; its CallReader (tool_reader.py) reads the section as it grows. A call opens
once its name is one of the request's tools and its arguments have begun (calls open in
order), and its arguments go out as far as they are final: for formats whose arguments are JSON
in the text (hermes, llama3_json, mistral, deepseek_v3, granite) that text as written, less trailing
whitespace outside strings and an escape not yet complete; for pythonic and qwen3_coder each
argument's `"key": value` once the argument is whole, so the pieces put together are the whole
parse's `json.dumps` text. At the end the whole reply is parsed as it is unstreamed
(parse_auto_calls), and that parse settles the stream:

- calls that agree with what went out: the rest of each call's arguments (each call's pieces
  put together parse, json.loads, to the whole parse's arguments), the calls not opened yet
  whole, then finish_reason "tool_calls";
- no calls (bad JSON, an unknown tool, max_tokens cut a call), and none went out: the held text
  as content with the sample's finish_reason, as before calls streamed;
- no calls, or calls that disagree with what went out (a key written twice), after one went
  out: nothing more (text already sent as a call is never sent again as content) and the
  sample's finish_reason: "length", or "stop" where the calls did not parse. vLLM's stream
  ends the same way but says "tool_calls" for the latter; "stop" lets a client tell.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from troupe.gateway.tool_auto import (
    AutoCallStream,
    ToolParserName,
    auto_call_reader,
    auto_tool_stream,
)
from troupe.gateway.tool_format import ToolCallDict
from troupe.gateway.tool_reader import CallReader, SectionSoFar


@dataclasses.dataclass(frozen=True)
class ContentPiece:
    text: str


@dataclasses.dataclass(frozen=True)
class CallOpened:
    """A call begins: its id and name (its arguments follow as ArgumentsPieces)."""

    index: int
    call_id: str
    name: str


@dataclasses.dataclass(frozen=True)
class ArgumentsPiece:
    index: int
    text: str


StreamPiece = ContentPiece | CallOpened | ArgumentsPiece


@dataclasses.dataclass(frozen=True)
class StreamEnd:
    """How the reply ends: `is_calls` (finish_reason "tool_calls") after `pieces`, or `text`
    as content with the sample's own finish_reason."""

    is_calls: bool
    pieces: tuple[StreamPiece, ...] = ()
    text: str = ""


@dataclasses.dataclass
class _Opened:
    call_id: str
    name: str
    arguments: str = ""  # what went out


class StreamedCalls:
    """One streamed "auto" reply (see the module docstring)."""

    def __init__(self, held: AutoCallStream, reader: CallReader, names: Sequence[str]) -> None:
        self._held = held
        self._reader = reader
        self._names = frozenset(names)
        self._opened: list[_Opened] = []
        self._content = ""  # the content from inside the call section that went out
        self._is_stuck = False  # the reader's calls stopped extending what went out

    def delta(self, piece: str) -> list[StreamPiece]:
        """What `piece` lets go out now."""
        out: list[StreamPiece] = []
        if content := self._held.delta(piece):
            out.append(ContentPiece(content))
        start = self._held.held_from
        if start is not None and not self._is_stuck:
            out += self._follow(self._reader.read(self._held.text, start, is_final=False))
        return out

    def finish(self, stopped: bool) -> StreamEnd:
        """The end (`stopped`: the reply ended by itself, not cut by max_tokens)."""
        rest, calls = self._held.finish(stopped)
        if not calls:
            return StreamEnd(False, text="" if self._opened else rest)
        start = self._held.held_from
        section = None
        if start is not None:
            section = self._reader.read(self._held.text, start, is_final=True)
        pieces = self._settle(calls, section)
        return StreamEnd(False) if pieces is None else StreamEnd(True, tuple(pieces))

    def _follow(self, section: SectionSoFar) -> list[StreamPiece]:
        out: list[StreamPiece] = []
        if len(section.calls) < len(self._opened):
            self._is_stuck = True
        for i, call in enumerate(section.calls):
            if self._is_stuck:
                break
            if i == len(self._opened):
                if call.name is None or call.name not in self._names or call.arguments is None:
                    break
                self._opened.append(_Opened(call.call_id or self._reader.call_id(), call.name))
                out.append(CallOpened(i, self._opened[i].call_id, call.name))
            sent = self._opened[i]
            arguments = call.arguments
            if (
                call.name != sent.name
                or arguments is None
                or not arguments.startswith(sent.arguments)
            ):
                self._is_stuck = True
            elif len(arguments) > len(sent.arguments):
                out.append(ArgumentsPiece(i, arguments[len(sent.arguments) :]))
                sent.arguments = arguments
        if self._opened:
            out += self._more_content(section)
        return out

    def _more_content(self, section: SectionSoFar) -> list[StreamPiece]:
        if len(section.content) <= len(self._content):
            return []
        if not section.content.startswith(self._content):
            return []
        piece, self._content = section.content[len(self._content) :], section.content
        return [ContentPiece(piece)]

    def _settle(
        self, calls: list[ToolCallDict], section: SectionSoFar | None
    ) -> list[StreamPiece] | None:
        """The last pieces, given the whole parse's calls (None: they disagree with what
        went out)."""
        if len(calls) < len(self._opened):
            return None
        out = [] if section is None else self._more_content(section)
        read = () if section is None else section.calls
        for i, call in enumerate(calls):
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            if i >= len(self._opened):
                out.append(CallOpened(i, call["id"], name))
                if arguments:
                    out.append(ArgumentsPiece(i, arguments))
                continue
            sent = self._opened[i]
            if name != sent.name:
                return None
            # the reader's text as written first (a JSON format's, which the whole parse
            # re-serializes), else the whole parse's (pythonic and qwen3_coder: the same text)
            candidates = [arguments]
            if i < len(read) and (written := read[i].arguments) is not None:
                candidates.insert(0, written)
            full = next(
                (c for c in candidates if c.startswith(sent.arguments) and _same(c, arguments)),
                None,
            )
            if full is None:
                return None
            if len(full) > len(sent.arguments):
                out.append(ArgumentsPiece(i, full[len(sent.arguments) :]))
        return out


def _same(arguments: str, whole: str) -> bool:
    """Whether streamed arguments say what the whole parse's do."""
    if arguments == whole:
        return True
    try:
        return bool(json.loads(arguments) == json.loads(whole))
    except ValueError:
        return False


def streamed_calls(tools: Sequence[dict[str, Any]], parser: ToolParserName) -> StreamedCalls:
    """A streamed "auto" reply's reader in `parser`'s format (`tools`: the request's)."""
    names = [t["function"]["name"] for t in tools]
    return StreamedCalls(auto_tool_stream(tools, parser), auto_call_reader(tools, parser), names)
