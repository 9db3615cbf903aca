"""gateway/answer_tags.py: an answer's `<answer>` tags taken away, whole and streamed cut at
every point, with only a possible tag held back."""

from __future__ import annotations

import pytest
from troupe.gateway.answer_tags import AnswerTags


def _whole(text: str) -> str:
    tags = AnswerTags("<answer>", "</answer>")
    return tags.feed(text) + tags.flush()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>\nParis.\n</answer>", "Paris."),
        ("\n<answer>\nParis.\n</answer>\n", "Paris."),  # whitespace after the tag: dropped
        ("<answer>\nA\n</answer>\n more", "A\n more"),  # what else follows it is kept
        ("<answer>Paris.</answer>", "Paris."),
        ("<answer>\n\nTwo lines\n\n</answer>", "\nTwo lines\n"),  # one newline each side
        ("Plain.", "Plain."),
        ("  Plain.", "  Plain."),
        ("Not <answer> leading", "Not <answer> leading"),
        ("x </answer> y", "x  y"),  # a closing tag anywhere is dropped
        ("<answer>\ncut off mid</ans", "cut off mid</ans"),
        ("<ans", "<ans"),
        ("", ""),
        ("\n\n", "\n\n"),
    ],
)
def test_whole_and_cut_anywhere(text: str, expected: str) -> None:
    assert _whole(text) == expected
    for pieces in [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]:
        tags = AnswerTags("<answer>", "</answer>")
        assert "".join(tags.feed(p) for p in pieces) + tags.flush() == expected, pieces


def test_only_a_possible_tag_is_held() -> None:
    tags = AnswerTags("<answer>", "</answer>")
    assert tags.feed(" \n<an") == ""  # may be the opening tag
    assert tags.feed("swer>") == ""  # its newline may come next
    assert tags.feed("\nIt is") == "It is"
    assert tags.feed(" sunny.\n") == " sunny."  # "\n" may begin "\n</answer>"
    assert tags.feed("More.") == "\nMore."
    assert tags.feed("\n</answer>") == ""
    assert tags.feed("\n ") == ""  # after the closing tag: held
    assert tags.flush() == ""  # and dropped at the end
