"""Pythonic tool calls read as they are written (`--tool-call-parser pythonic`, a
tool_reader.CallReader): the list `[f(a=1, b="x"), g()]` followed token by token.

    [get_weather(city="Paris", days=3)]
     ^ opens: name    ^ '{"city": "Paris"'  ^ ', "days": 3'  ^ '}'

Each keyword's value is scanned up to the `,` or `)` that ends it (outside strings, triple
quoted ones too, and brackets), then read as tool_pythonic's whole parse reads it (`ast`, a
literal, never evaluated) and sent as one JSON member, so the pieces put together are the
whole parse's `json.dumps` text. Whatever the scan cannot follow (a comment, a positional
argument, a value that is no literal, a keyword given twice) stops the reading there: the
whole parse at the end settles the rest.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re

from troupe.gateway.tool_format import vllm_call_id
from troupe.gateway.tool_pythonic import PYTHON_START, NotLiteral, literal_value
from troupe.gateway.tool_reader import CallSoFar, SectionSoFar, members_so_far

_NAME = r"[^\W\d]\w*"
_LIST = re.compile(r"\s*\[")
_CALL = re.compile(rf"\s*({_NAME})\s*\(")
_KEY = re.compile(rf"\s*({_NAME})\s*=")
_CLOSE = re.compile(r"\s*\)")
_NEXT = re.compile(r"\s*([,\]])")
_WAIT = re.compile(rf"\s*(?:{_NAME}\s*)?")  # what may still become a name, a key or `)`
_CODE = re.compile(r"[^'\"()\[\]{},#]*")
_STRING_BODY = {q: re.compile(rf"[^{q}\\]*") for q in "'\""}


@dataclasses.dataclass
class _Call:
    name: str
    members: list[str] = dataclasses.field(default_factory=list)
    keys: set[str] = dataclasses.field(default_factory=set)
    is_closed: bool = False

    def so_far(self) -> CallSoFar:
        return CallSoFar(self.name, members_so_far(self.members, self.is_closed))


class PythonicReader:
    """The state of one reply's scan; `read` goes on from where the last one stopped."""

    def __init__(self) -> None:
        self._pos = -1  # text[:_pos] is read (-1: not begun)
        self._state = "list"  # list, call, arg, value, next, done, stuck
        self._calls: list[_Call] = []
        self._key = ""  # the keyword whose value is being scanned
        self._value_at = 0
        self._depth = 0  # brackets open in the value
        self._quote = ""  # the open string's delimiter (', ", ''' or """), "" outside

    def call_id(self) -> str:
        return vllm_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        if self._pos < 0:
            self._pos = start + (len(PYTHON_START) if text.startswith(PYTHON_START, start) else 0)
        while self._state not in ("done", "stuck") and self._pos < len(text):
            if not self._step(text):
                break  # more text is needed
        return SectionSoFar(tuple(call.so_far() for call in self._calls))

    def _step(self, text: str) -> bool:
        """One token further (False: none is whole yet)."""
        if self._state == "value":
            return self._value(text)
        pos, state = self._pos, self._state
        if state == "list":
            found = _LIST.match(text, pos)
            if found:
                return self._go(found.end(), "call")
            return self._wait_space(text, pos)
        if state == "call":
            if found := _CALL.match(text, pos):
                self._calls.append(_Call(found.group(1)))
                return self._go(found.end(), "arg")
        elif state == "arg":
            if found := _CLOSE.match(text, pos):
                self._calls[-1].is_closed = True
                return self._go(found.end(), "next")
            if found := _KEY.match(text, pos):
                self._key, self._value_at, self._depth = found.group(1), found.end(), 0
                return self._go(found.end(), "value")
        else:  # next: a `,` before the next call, or the list's `]`
            if found := _NEXT.match(text, pos):
                return self._go(found.end(), "call" if found.group(1) == "," else "done")
            return self._wait_space(text, pos)
        if _WAIT.fullmatch(text, pos):
            return False
        self._state = "stuck"
        return False

    def _go(self, pos: int, state: str) -> bool:
        self._pos, self._state = pos, state
        return True

    def _wait_space(self, text: str, pos: int) -> bool:
        if not text[pos:].isspace():
            self._state = "stuck"
        return False

    def _value(self, text: str) -> bool:
        """Scan a keyword's value on to the `,` or `)` that ends it."""
        pos = self._pos
        if self._quote:
            return self._string(text)
        pos = _CODE.match(text, pos).end()  # type: ignore[union-attr]
        self._pos = pos
        if pos >= len(text):
            return False
        c = text[pos]
        if c in "'\"":
            if text.startswith(c * 3, pos):
                self._quote = c * 3
            elif text[pos:] in (c, c * 2):
                return False  # maybe a triple quote: wait
            else:
                self._quote = c
            self._pos = pos + len(self._quote)
        elif c in "([{":
            self._depth += 1
            self._pos = pos + 1
        elif self._depth and c in ")]},":  # inside brackets: a comma or a closing one
            self._depth -= c != ","
            self._pos = pos + 1
        elif c in "),":
            self._end_value(text, pos)
        else:  # a comment, or a bracket closing what this value did not open
            self._state = "stuck"
        return True

    def _string(self, text: str) -> bool:
        quote = self._quote
        pos = _STRING_BODY[quote[0]].match(text, self._pos).end()  # type: ignore[union-attr]
        self._pos = pos
        if pos >= len(text):
            return False
        if text[pos] == "\\":
            if pos + 1 >= len(text):
                return False
            self._pos = pos + 2
            return True
        if text.startswith(quote, pos):
            self._quote, self._pos = "", pos + len(quote)
        elif len(quote) == 3 and quote.startswith(text[pos:]):
            return False  # maybe the closing triple: wait
        else:
            self._pos = pos + 1
        return True

    def _end_value(self, text: str, pos: int) -> None:
        """The value text[_value_at:pos] is whole: one more member, or stuck."""
        call = self._calls[-1]
        try:
            tree = ast.parse(text[self._value_at : pos].strip(), mode="eval")
            value = literal_value(tree.body)
            member = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (SyntaxError, ValueError, NotLiteral, RecursionError, MemoryError):
            self._state = "stuck"
            return
        if self._key in call.keys:
            self._state = "stuck"
            return
        call.keys.add(self._key)
        call.members.append(f"{json.dumps(self._key, ensure_ascii=False)}: {member}")
        if text[pos] == ")":
            call.is_closed = True
            self._go(pos + 1, "next")
        else:
            self._go(pos + 1, "arg")
