"""actors/core/marker_tail.py: the longest tail held back is a proper prefix of a marker, from
`start` on, with exact expectations."""

from __future__ import annotations

import pytest
from troupe.actors.core.marker_tail import marker_tail


@pytest.mark.parametrize(
    ("text", "markers", "start", "held"),
    [
        ("abc<tool", ("<tool_call>",), 0, 5),
        ("abc<tool_call>", ("<tool_call>",), 0, 0),  # whole: found, not held
        ("abc", ("<tool_call>",), 0, 0),
        ("x</th", ("</think>", "</s>"), 0, 4),  # the longer of two markers' starts
        ("x</", ("</think>", "</s>"), 0, 2),
        ("<<<", ("<<<<",), 0, 3),
        ("<<<", ("<<<<",), 2, 1),  # only text[start:] may be held
        ("ab", ("b", "ab"), 0, 1),  # tails shorter than the longest marker: "b" whole is held
        ("", ("stop",), 0, 0),
    ],
)
def test_the_held_tail(text: str, markers: tuple[str, ...], start: int, held: int) -> None:
    assert marker_tail(text, markers, start) == held
