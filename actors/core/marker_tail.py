"""How much of a text's end to hold back while streaming: the longest tail that may be the
start of a marker cut in two (a stop string, a reasoning tag, a tool-call marker), so the
next piece can complete it. One home for the stop strings (actors/core/stop_strings.py), the
reasoning parsers (gateway/reasoning.py) and the tool-call streams (gateway/tool_format.py,
gateway/tool_reader.py)."""

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
