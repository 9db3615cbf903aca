"""Stop strings across delta boundaries: exact outputs."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from troupe.actors.core.stop_strings import StopStringMatcher


def test_stop_split_over_three_deltas() -> None:
    m = StopStringMatcher(["<END>"])
    assert m.feed("result: 4<") == "result: 4"
    assert m.feed("EN") == ""
    assert m.matched is None
    assert m.feed("D> trailing") == ""
    assert m.matched == "<END>"
    assert m.feed("more") == ""
    assert m.flush() == ""


def test_stop_split_over_three_deltas_included() -> None:
    m = StopStringMatcher(["<END>"], include_in_output=True)
    assert m.feed("ok <") + m.feed("EN") + m.feed("D> x") == "ok <END>"
    assert m.matched == "<END>"


def test_false_start_is_released() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.feed("a ST") == "a "
    assert m.feed("O") == ""
    assert m.feed("RM") == "STORM"
    assert m.matched is None
    assert m.feed(" S") == " "
    assert m.flush() == "S"  # the stream ended mid-false-start: held text comes out


def test_false_start_overlapping_real_match() -> None:
    m = StopStringMatcher(["abc"])
    assert m.feed("aab") == "a"  # "ab" may still become "abc"
    assert m.feed("abc") == "ab"
    assert m.matched == "abc"


def test_earliest_match_wins_then_list_order() -> None:
    m = StopStringMatcher(["world", "o w"])
    assert m.feed("hello world") == "hell"
    assert m.matched == "o w"
    tie = StopStringMatcher(["ab", "abc"])
    assert tie.feed("xabc") == "x" and tie.matched == "ab"


def test_match_inside_one_delta_and_longest_hold() -> None:
    m = StopStringMatcher(["\n\n", "Observation:"])
    assert m.feed("Thought: x\nObs") == "Thought: x\n"  # holds "Obs"
    assert m.feed("ervation: y") == ""
    assert m.matched == "Observation:"


def test_no_stops_is_pass_through() -> None:
    m = StopStringMatcher([])
    assert m.feed("anything") == "anything" and m.flush() == ""
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher([""])


@given(
    text=st.text(alphabet="abAB\n", max_size=40),
    stops=st.lists(st.text(alphabet="abAB\n", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
)
def test_equivalent_to_matching_the_whole_text(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    m = StopStringMatcher(stops)
    out = "".join(m.feed(text[a:b]) for a, b in itertools.pairwise(bounds))
    # The stop that completes first wins (as token by token); ties: earliest start, then order.
    hits = [(text.find(s) + len(s), text.find(s), i) for i, s in enumerate(stops) if s in text]
    if hits:
        _, start, index = min(hits)
        assert m.matched == stops[index]
        assert out == text[:start]
    else:
        assert m.matched is None
        assert out + m.flush() == text


def test_a_stop_string_may_start_in_skipped_text() -> None:
    """vLLM's min_tokens: skipped text is emitted unmatched, but a stop string that starts in
    it and ends in later text matches (the client already saw its start)."""
    m = StopStringMatcher(["END"])
    assert m.skip("the EN") == "the EN"  # would have matched "END" here: not checked yet
    assert m.matched is None
    assert m.feed("D and more") == ""
    assert m.matched == "END"
    included = StopStringMatcher(["END"], include_in_output=True)
    assert included.skip("the E") == "the E"
    assert included.feed("N") == ""  # held: could still be END
    assert included.feed("D!") == "ND"


def test_a_stop_string_wholly_in_skipped_text_never_matches() -> None:
    m = StopStringMatcher(["END"])
    assert m.skip("END") == "END"
    assert m.feed("x") == "x" and m.matched is None
    assert m.feed(" EN") == " " and m.feed("Dx") == "" and m.matched == "END"
