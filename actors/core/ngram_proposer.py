"""Prompt lookup (n-gram) proposals: the continuation of the sequence's own latest n-gram,
found earlier in its prompt or output. No model; numpy over the token history.

    tokens   ... a b c d e ... x y a b c   (suffix "a b c", n = 3)
    match        ^^^^^ at i            ^^^^^ the suffix itself (excluded)
    proposal           d e ...             tokens[i + n : i + n + k]

The longest n in [min_n, max_n] with a match wins; among its matches, the latest one that has
k tokens after it (else the one with the longest continuation): in an "edit this text"
prompt the text is there once, and the latest full match follows the text being copied.

propose_ngram scans the whole history (the reference); NgramIndex gives the same answer from
an index of every n-gram's start positions that grows with the tokens appended since its last
call, so a decode step's proposal costs O(max_n), not O(tokens) (on the H200 host the scan
cost ~0.2 ms per request per step, which showed at small batches).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(tokens: Sequence[int], k: int, min_n: int, max_n: int) -> tuple[int, ...]:
    """Up to `k` tokens continuing `tokens` (empty: no n-gram of length min_n..max_n recurs)."""
    num = len(tokens)
    if k < 1 or num <= min_n:
        return ()
    history = np.fromiter(tokens, np.int64, num)
    for n in range(min(max_n, num - 1), min_n - 1, -1):
        suffix = history[num - n :]
        # windows starting at 0 .. num-n-1: every occurrence but the suffix itself
        windows = sliding_window_view(history[: num - 1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if len(starts) == 0:
            continue
        ends = starts + n  # first proposed position of each match
        full = starts[num - ends >= k]
        start = int(full[-1]) if len(full) else int(starts[0])
        return tuple(history[start + n : start + n + k].tolist())
    return ()


class NgramIndex:
    """Every n-gram (min_n..max_n tokens) of one growing token list -> its start positions,
    ascending. `propose` answers as propose_ngram does for the list it is given, which must
    extend the list of the previous call (a shorter one rebuilds the index)."""

    __slots__ = ("max_n", "min_n", "num_indexed", "starts")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.num_indexed = 0
        self.starts: dict[tuple[int, ...], list[int]] = {}

    def propose(self, tokens: Sequence[int], k: int) -> tuple[int, ...]:
        num = len(tokens)
        if k < 1 or num <= self.min_n:
            return ()
        self._extend(tokens, num)
        for n in range(min(self.max_n, num - 1), self.min_n - 1, -1):
            starts = self.starts[tuple(tokens[num - n :])]
            last = len(starts) - 1  # starts[last] == num - n: the suffix itself, excluded
            if last == 0:
                continue
            full = bisect_right(starts, num - n - k, 0, last) - 1  # latest with k after it
            start = starts[full] if full >= 0 else starts[0]
            return tuple(tokens[start + n : start + n + k])
        return ()

    def _extend(self, tokens: Sequence[int], num: int) -> None:
        if num < self.num_indexed:
            self.num_indexed, self.starts = 0, {}
        starts, done = self.starts, self.num_indexed
        # n-grams ending after `done`: for each n, zip builds the tuples in C (a prompt's first
        # index costs ~3 dict operations per token, not a slice and a tuple each)
        for n in range(self.min_n, self.max_n + 1):
            first = max(done - n + 1, 0)  # start of the first n-gram not indexed yet
            if first + n > num:
                continue
            tail = tokens[first:num]
            grams = zip(*(tail[j:] for j in range(n)), strict=False)
            for start, gram in enumerate(grams, first):
                found = starts.get(gram)
                if found is None:
                    starts[gram] = [start]
                else:
                    found.append(start)
        self.num_indexed = num
