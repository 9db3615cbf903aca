"""One JSON object read as its text is written: its top-level members, where each value begins
and (once written) ends, so a tool call's name is known when its string closes and its
arguments can go out as they are written (gateway/tool_reader.py).

    {"name": "f", "arguments": {"a": "x\\u00e9", "b": 1}}
             ^--^              ^----------------------^   Member(key, start, end)

The scan is incremental (each character is looked at once, however the text is cut) and
lenient: it does not check the JSON, only follows its strings and brackets; the whole parse at
the end judges. What `value_so_far` gives of a value still being written is final: trailing
whitespace outside strings and an escape not yet complete (`\\`, `\\u00`) are held back.
"""

from __future__ import annotations

import dataclasses
import json
import re

from troupe.gateway.tool_reader import CallSoFar

_SPACE = " \t\n\r"
_STRING_BODY = re.compile(r'[^"\\]*')
_CONTAINER_BODY = re.compile(r'[^"{}\[\]]*')
_SCALAR = re.compile(r"[^,}\]\s]*")

# states of ObjectScan
_BEFORE, _KEY, _IN_KEY, _COLON, _VALUE, _IN_VALUE, _AFTER, _DONE, _BAD = range(9)


@dataclasses.dataclass
class Member:
    """A top-level member: its key, and its value's span (end None: still being written)."""

    key: str
    start: int
    kind: str  # the value's first character: "{", "[", '"', or that of a scalar
    end: int | None = None


class ObjectScan:
    """The object that begins (after whitespace) at `start` of a text that only grows."""

    def __init__(self, start: int) -> None:
        self.pos = start  # text[:pos] has been read
        self.members: list[Member] = []
        self.end: int | None = None  # after the closing brace
        self.is_bad = False  # not an object
        self._start: int | None = None  # where its `{` is
        self._state = _BEFORE
        self._key_start = 0
        self._pending_key = ""  # the key read, its value not begun yet
        self._depth = 0  # brackets open inside a container value
        self._in_string = False
        self._escape_at: int | None = None  # where an escape not yet complete began
        self._escape_need = 0

    def advance(self, text: str, limit: int) -> None:
        """Read on up to `limit` (text[:limit] is what the object may span so far)."""
        i = self.pos
        while i < limit and self._state not in (_DONE, _BAD):
            if self._in_string:
                i = self._string(text, i, limit)
                if not self._in_string and self._state == _IN_KEY:
                    self._end_key(text, i)
                elif not self._in_string and self._state == _IN_VALUE and self._depth == 0:
                    self.members[-1].end = i
                    self._state = _AFTER
                continue
            if self._state == _IN_VALUE:
                i = self._value(text, i, limit)
                continue
            c = text[i]
            if c in _SPACE:
                i += 1
                continue
            i = self._token(c, i)
        self.pos = i
        self.is_bad = self._state == _BAD

    def value_so_far(self, text: str, member: Member, limit: int) -> str:
        """The final part of `member`'s value (the last member, if it is still written)."""
        return self._so_far(text, member.start, member.end, limit)

    def object_so_far(self, text: str, limit: int) -> str | None:
        """The final part of the whole object's text (None: its `{` is not written yet)."""
        if self._start is None:
            return None
        return self._so_far(text, self._start, self.end, limit)

    def _so_far(self, text: str, start: int, end: int | None, limit: int) -> str:
        if end is not None:
            return text[start:end]
        end = min(self.pos, limit)
        if self._escape_at is not None:
            end = self._escape_at
        elif not self._in_string:
            while end > start and text[end - 1] in _SPACE:
                end -= 1
        return text[start:end]

    def _token(self, c: str, i: int) -> int:
        """One structural character outside strings and values."""
        state = self._state
        if state == _BEFORE:
            self._state, self._start = (_KEY, i) if c == "{" else (_BAD, None)
        elif state == _KEY and c == '"':
            self._state, self._key_start, self._in_string = _IN_KEY, i, True
        elif state == _KEY and c == "}" and not self.members:
            self._state, self.end = _DONE, i + 1
        elif state == _COLON:
            self._state = _VALUE if c == ":" else _BAD
        elif state == _VALUE:
            key = self._pending_key
            self.members.append(Member(key, i, c))
            self._state = _IN_VALUE
            if c in "{[":
                self._depth = 1
            elif c == '"':
                self._in_string = True
            else:
                return i  # a scalar: _value reads it from its first character
        elif state == _AFTER and c == ",":
            self._state = _KEY
        elif state == _AFTER and c == "}":
            self._state, self.end = _DONE, i + 1
        else:
            self._state = _BAD
        return i + 1

    def _end_key(self, text: str, i: int) -> None:
        try:
            key = json.loads(text[self._key_start : i])
        except ValueError:
            self._state = _BAD
            return
        self._pending_key = key
        self._state = _COLON

    def _value(self, text: str, i: int, limit: int) -> int:
        """Inside a value outside its strings: a container's brackets, or a scalar."""
        member = self.members[-1]
        if member.kind not in "{[":
            i = _SCALAR.match(text, i, limit).end()  # type: ignore[union-attr]
            if i < limit:
                member.end, self._state = i, _AFTER
            return i
        i = _CONTAINER_BODY.match(text, i, limit).end()  # type: ignore[union-attr]
        if i >= limit:
            return i
        c = text[i]
        if c == '"':
            self._in_string = True
        elif c in "{[":
            self._depth += 1
        else:
            self._depth -= 1
            if self._depth == 0:
                member.end, self._state = i + 1, _AFTER
        return i + 1

    def _string(self, text: str, i: int, limit: int) -> int:
        """Inside a string: on to its closing quote (after it), or to `limit`."""
        while i < limit:
            if self._escape_at is not None:
                if i == self._escape_at + 1 and text[i] == "u":
                    self._escape_need = 4
                else:
                    self._escape_need -= 1
                if self._escape_need == 0:
                    self._escape_at = None
                i += 1
                continue
            i = _STRING_BODY.match(text, i, limit).end()  # type: ignore[union-attr]
            if i >= limit:
                break
            if text[i] == '"':
                self._in_string = False
                return i + 1
            self._escape_at, self._escape_need = i, 1
            i += 1
        return i


def object_at(scans: dict[int, ObjectScan], text: str, body: int, end: int) -> str | None:
    """The final part of the object that begins (after whitespace) at `body`, read up to `end`;
    its scan is kept in `scans` by where it begins (None: its `{` is not written yet)."""
    scan = scans.setdefault(body, ObjectScan(body))
    scan.advance(text, end)
    return scan.object_so_far(text, end)


def object_call(
    text: str,
    scan: ObjectScan,
    limit: int,
    argument_keys: tuple[str, ...] = ("arguments",),
    *,
    default: str | None = "{}",
    is_object_only: bool = False,
) -> CallSoFar:
    """A {"name": ..., "arguments": ...} object read so far as a call: the first string
    "name"; the arguments under the first of `argument_keys` present (a string value: its
    text once whole, as the whole parse takes it; `is_object_only`: only an object), `default`
    when the object closed without them."""
    scan.advance(text, limit)
    name: str | None = None
    found: dict[str, Member] = {}
    for member in scan.members:
        if member.key == "name" and name is None and member.end is not None:
            value = _string_value(text[member.start : member.end]) if member.kind == '"' else None
            name = value
        if member.key in argument_keys:
            found.setdefault(member.key, member)
    args = next((found[k] for k in argument_keys if k in found), None)
    if args is None:
        return CallSoFar(name, default if scan.end is not None else None)
    if is_object_only and args.kind != "{":
        return CallSoFar(name)
    if args.kind == '"':
        whole = None if args.end is None else _string_value(text[args.start : args.end])
        return CallSoFar(name, whole)
    return CallSoFar(name, scan.value_so_far(text, args, limit))


def _string_value(raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
