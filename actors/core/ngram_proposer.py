"""Prompt lookup (n-gram) proposals: the continuation of the sequence's own latest n-gram,
found earlier in its prompt or output. No model; numpy over the token history.

    tokens   ... a b c d e ... x y a b c   (suffix "a b c", n = 3)
    match        ^^^^^ at i            ^^^^^ the suffix itself (excluded)
    proposal           d e ...             tokens[i + n : i + n + k]

The longest n in [min_n, max_n] with a match wins; among its matches, the latest one that has
k tokens after it (else the one with the longest continuation): in an "edit this text"
prompt the text is there once, and the latest full match follows the text being copied.
"""

from __future__ import annotations

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
