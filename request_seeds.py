"""Where a request without a seed gets one: a stream of seeds from the engine's `seed`.

The runner draws one per new request (gpu/request_states.py); with prefill/decode
disaggregation the phase router draws them instead (actors/core/phase_router.py), in the same
order, so both executors sample such a request with the seed a single executor would use.
"""

from __future__ import annotations

import numpy as np


class SeedSource:
    """Seeds in [0, 2**63 - 1), reproducible from the engine's `seed`."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def draw(self) -> int:
        return int(self._rng.integers(0, 2**63 - 1))
