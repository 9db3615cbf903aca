"""What a tool-call format's streaming reader tells as the reply grows: the calls written so
far, each with its name once whole and its arguments' JSON text as far as it is final.

A reader is fed the whole reply so far (a text that only grows) and where its call section
begins; it answers a `SectionSoFar` whose every call's `arguments` only ever extends what an
earlier answer said (gateway/tool_stream.py sends the new part). What it cannot read yet it
leaves out: the reply's whole-text parse at the end settles every call (the reader only makes
the calls go out sooner), so a reader may stop early, never say something wrong.

    section "<tool_call>{"name": "f", "arguments": {"a": 1, "b"|
    calls   [CallSoFar(name="f", arguments='{"a": 1, "b"')]
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class CallSoFar:
    """One call as written so far. `name`: once whole (None before); `arguments`: the final
    prefix of its arguments' JSON text (None: not begun, so the call is not opened yet);
    `call_id`: the id the model wrote (Kimi K2's), None where the format has none."""

    name: str | None
    arguments: str | None = None
    call_id: str | None = None


@dataclasses.dataclass(frozen=True)
class SectionSoFar:
    """The call section so far: its calls, and (Hermes, whose text between calls is content)
    the content outside the calls that is final, whitespace at its end held back."""

    calls: tuple[CallSoFar, ...]
    content: str = ""


class CallReader(Protocol):
    """One streamed reply's call section, read as it grows (see the module docstring)."""

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        """The section `text[start:]` so far; `is_final`: the reply has ended."""
        ...

    def call_id(self) -> str:
        """A new call id, as this format's whole-reply parse makes them."""
        ...


def openai_call_id() -> str:
    """`call_` and 24 hex digits (Hermes, llama3_json, qwen3_coder and named or "required"
    tool_choice calls: gateway/tool_calls.py; vLLM's for these)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def members_so_far(members: list[str], is_closed: bool) -> str:
    """The JSON text of an object built one member (`"key": value`) at a time, as far as it
    is written: the same text `json.dumps` gives the whole dict once closed."""
    if not members and not is_closed:
        return ""
    return "{" + ", ".join(members) + ("}" if is_closed else "")


def spans(
    text: str, open_tag: str, close_tag: str, start: int, end: int, is_closed: bool
) -> list[tuple[int, int, bool]]:
    """(body start, body end, closed) after each `open_tag` in text[start:end], each body up
    to its `close_tag`; a body left open runs to `end`, closed if what holds it is
    (`is_closed`). The tag-delimited formats cut their blocks, calls and arguments with it."""
    out = []
    at = text.find(open_tag, start, end)
    while at >= 0:
        body = at + len(open_tag)
        close = text.find(close_tag, body, end)
        if close < 0:
            out.append((body, end, is_closed))
            break
        out.append((body, close, True))
        at = text.find(open_tag, close + len(close_tag), end)
    return out
