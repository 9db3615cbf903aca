"""A JSON value's text as it is written, re-written as `json.dumps(value, ensure_ascii=False)`
writes the value once whole: a tool call's arguments streamed as the model writes them then put
together are the text the whole-reply parse gives (json.dumps of the parsed arguments).

    written     {"city":"Par\\u00eds" ,"days": 3.50}
    canonical   {"city": "París", "days": 3.5}

`CanonicalJson.feed` takes a text that only grows (a call's arguments as a CallReader reads
them: gateway/tool_reader.py) and answers the canonical text of as much of it as is decided,
which only ever grows: whitespace outside strings dropped; `,` and `:` followed by one space;
a string's characters as they are, but its escapes as json.dumps writes them (a `\\u` escape
of a high surrogate held until what follows says whether it pairs); a number or literal held
until a character after it ends it (`1` may become `12`). Text that is not JSON stops it: what
went out stays, nothing more goes out, and the whole-reply parse at the end judges. What it
does not check (brackets that match, a key written twice) is the whole parse's to judge too.
"""

from __future__ import annotations

import json
import re

_SPACE = " \t\n\r"
_PLAIN = re.compile(r'[^"\\\x00-\x1f]*')  # string characters json.dumps writes as they are
_SCALAR = re.compile(r'[^\s,:\[\]{}"]*')
_HEX = re.compile(r"[0-9a-fA-F]{4}")


class CanonicalJson:
    """One value's canonical text, fed its written text as it grows."""

    def __init__(self) -> None:
        self.text = ""  # the canonical text so far
        self._pos = 0  # the written text up to here is in `text`
        self._in_string = False
        self.is_bad = False  # the written text is not JSON: `text` grows no more

    def feed(self, written: str) -> str:
        """The canonical text of `written` (what was fed before, extended) as far as decided."""
        out: list[str] = []
        i, end = self._pos, len(written)
        while i < end and not self.is_bad:
            if self._in_string:
                k = self._string(written, i, out)
                if k == i:  # an escape not complete yet
                    break
                i = k
                continue
            c = written[i]
            if c in _SPACE:
                i += 1
            elif c in "{}[]":
                out.append(c)
                i += 1
            elif c in ",:":
                out.append(c + " ")
                i += 1
            elif c == '"':
                out.append(c)
                self._in_string = True
                i += 1
            else:
                k = _SCALAR.match(written, i).end()  # type: ignore[union-attr]
                if k == end:  # what follows may still extend it
                    break
                out.append(_scalar(written[i:k]) or self._bad())
                i = k
        self._pos = i
        self.text += "".join(out)
        return self.text

    def _string(self, written: str, i: int, out: list[str]) -> int:
        """Inside a string from `i`: where reading stopped (`i` itself: wait for more)."""
        k = _PLAIN.match(written, i).end()  # type: ignore[union-attr]
        if k > i:
            out.append(written[i:k])
            return k
        c = written[i]
        if c == '"':
            out.append(c)
            self._in_string = False
            return i + 1
        if c != "\\":  # a raw control character: json.loads refuses it
            self._bad()
            return i + 1
        size = _escape_size(written, i)
        if size is None:
            return i
        try:
            value = json.loads('"' + written[i : i + size] + '"')
        except ValueError:
            self._bad()
            return i + 1
        out.append(json.dumps(value, ensure_ascii=False)[1:-1])
        return i + size

    def _bad(self) -> str:
        self.is_bad = True
        return ""


def _escape_size(written: str, i: int) -> int | None:
    """Length of the escape at `written[i]` (a backslash) as one piece to decode: two
    characters, a `\\uXXXX`, or a high surrogate's with the `\\uXXXX` after it; None: the text
    does not say yet."""
    end = len(written)
    if i + 1 >= end:
        return None
    if written[i + 1] != "u":
        return 2
    if i + 6 > end:
        return None
    if _HEX.fullmatch(written, i + 2, i + 6) is None:
        return 2  # not an escape: json.loads refuses it
    if not 0xD800 <= int(written[i + 2 : i + 6], 16) < 0xDC00:
        return 6
    after = written[i + 6 : i + 8]  # a high surrogate: does a \u escape follow?
    if after in ("", "\\"):
        return None
    if after != "\\u":
        return 6
    return 12 if i + 12 <= end else None


def _scalar(token: str) -> str | None:
    """A number or literal as json.dumps writes it (None: not one)."""
    try:
        value = json.loads(token)
    except ValueError:
        return None
    if isinstance(value, dict | list | str):
        return None
    return json.dumps(value)
