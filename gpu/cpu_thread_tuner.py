"""How many threads a one-row native call (a single sequence's decode step) should take, found
by timing decode steps rather than guessed.

A one-row call is memory-bound where the kernel keeps up with memory (AVX-512 VNNI) and
compute-bound where it does not (AVX2: its u8 x s8 dot products take several instructions).
On the first kind of 2-core machine a second thread bought nothing and lost the core the
engine's own threads stream tokens on (one thread 91-95 tok/s, two 40-46); on an AVX2-only
2-core EPYC the second thread is worth 64-68 -> 87-90 tok/s (docs/benchmarks.md, session 52).
So with `cpu_kernel_threads` 0 (auto) the fast path times its first decode steps under each
count, alternating (a sequence's steps grow slowly with its length, alike for both), skips each
count's first steps (a pool waking up), and keeps the count with the lower median. A thread
count changes no result: every output row and attention head is one thread's whole sum.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class OneRowThreads(Protocol):
    """What the tuner sets: gpu/cpu_q4lib.Q4Lib."""

    one_row_threads: int

    def set_one_row_threads(self, threads: int) -> None: ...


class OneRowTuner:
    """Times `run`'s calls under each candidate thread count, then keeps the fastest."""

    def __init__(
        self,
        lib: OneRowThreads,
        candidates: tuple[int, ...],
        *,
        trials: int = 8,
        warm_up: int = 2,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        assert len(candidates) > 1, "nothing to choose"
        self._lib, self._clock = lib, clock
        self.candidates = candidates
        self._trials, self._warm_up = trials, warm_up
        self._times: dict[int, list[float]] = {c: [] for c in candidates}
        self._calls = 0
        self.chosen: int | None = None

    def run(self, call: Callable[[], T]) -> T:
        """`call()`, timed under the next candidate while the choice is open."""
        if self.chosen is not None:
            if self._lib.one_row_threads != self.chosen:  # another runner loaded the library
                self._lib.set_one_row_threads(self.chosen)
            return call()
        threads = self.candidates[self._calls % len(self.candidates)]
        self._lib.set_one_row_threads(threads)
        start = self._clock()
        out = call()
        elapsed = self._clock() - start
        if self._calls >= self._warm_up * len(self.candidates):
            self._times[threads].append(elapsed)
        self._calls += 1
        if all(len(times) >= self._trials for times in self._times.values()):
            self.chosen = min(self.candidates, key=lambda c: statistics.median(self._times[c]))
            self._lib.set_one_row_threads(self.chosen)
        return out
