"""Pairwise covers for the interpreter-run kernel tests.

Under TRITON_INTERPRET=1 every program instance of a launch runs in Python, so a kernel test's
whole product of parameters (case x group x block size x load path ...) costs the CPU suite
minutes. A pairwise cover keeps every pair of values of any two parameters (the interactions
that tiling and masking bugs come from) in a fraction of the launches; the GPU keeps the whole
product. `pairwise(rows, domains)` checks a hand-picked cover and returns its rows, so an edit
that drops a pair fails at collection, naming it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any


def pairwise(rows: Sequence[tuple[Any, ...]], domains: Sequence[Sequence[Any]]) -> list[Any]:
    """`rows` (one value per domain each) as a list, once every pair of values of any two
    domains is met by some row; else ValueError naming the first missing pair."""
    for row in rows:
        if len(row) != len(domains) or any(v not in d for v, d in zip(row, domains, strict=True)):
            raise ValueError(f"row {row!r} is not one value of each domain {list(domains)!r}")
    for i, j in itertools.combinations(range(len(domains)), 2):
        met = {(row[i], row[j]) for row in rows}
        for pair in itertools.product(domains[i], domains[j]):
            if pair not in met:
                raise ValueError(f"no row has parameter {i} = {pair[0]!r} with {j} = {pair[1]!r}")
    return list(rows)
