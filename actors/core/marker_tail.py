"""How much of a text's end to hold back while streaming: the longest tail that may be the
start of a marker cut in two (a stop string, a reasoning tag, a tool-call marker), so the
next piece can complete it. One home for the stop strings (actors/core/stop_strings.py), the
reasoning parsers (gateway/reasoning.py, gateway/answer_tags.py) and the tool-call streams
(gateway/tool_format.py, gateway/tool_reader.py); `first_marker` finds a whole one."""

from __future__ import annotations


def marker_tail(text: str, markers: tuple[str, ...], start: int = 0) -> int:
    """Length of the longest tail of `text[start:]` that is a proper prefix of one of
    `markers` (0: none; a whole marker is found, not held)."""
    longest = max(len(marker) for marker in markers)
    for size in range(min(longest - 1, len(text) - start), 0, -1):
        tail = text[-size:]
        if any(marker.startswith(tail) for marker in markers):
            return size
    return 0


def first_marker(text: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """(where, which) of the first of `markers` in `text` (the shortest where several begin
    there); (-1, "") when none is."""
    found = [(at, marker) for marker in markers if (at := text.find(marker)) >= 0]
    return min(found, default=(-1, ""))
