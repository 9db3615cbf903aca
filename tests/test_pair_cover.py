"""tests/pair_cover.py: a cover that meets every pair passes through; one that misses a pair,
or a row off the domains, is refused naming it."""

from __future__ import annotations

import pytest
from pair_cover import pairwise

DOMAINS = [["a", "b"], [1, 2], [True, False]]
COVER = [("a", 1, True), ("a", 2, False), ("b", 1, False), ("b", 2, True)]


def test_a_cover_passes_through() -> None:
    assert pairwise(COVER, DOMAINS) == COVER


def test_a_missing_pair_is_named() -> None:
    with pytest.raises(ValueError, match=r"parameter 0 = 'b' with 1 = 2"):
        pairwise(COVER[:3], DOMAINS)


def test_a_row_off_the_domains_is_refused() -> None:
    with pytest.raises(ValueError, match=r"row \('c', 1, True\)"):
        pairwise([*COVER, ("c", 1, True)], DOMAINS)
