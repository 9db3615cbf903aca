"""Preemption policy: which running request gives way when GPU blocks run out, and how: swapped
out to the CPU pool (its KV kept) or freed and recomputed later.

A new policy: a class and its entry in PREEMPTION_POLICIES (config checks `preemption_mode`
against it), and a test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Holding(Protocol):
    """What a preemption policy reads of a request (actors/core/request_state.Request)."""

    @property
    def num_blocks(self) -> int: ...  # positions of its GPU block table
    @property
    def num_released(self) -> int: ...  # of those, released behind a window


R = TypeVar("R", bound=Holding)


class PreemptionPolicy(Protocol):
    def victim(self, running: Sequence[R]) -> R: ...  # `running`: queue order
    def swaps(self, victim: Holding, num_cpu_free: int) -> bool: ...  # else: recompute


class SwapWhenRoom:
    """The last in queue order gives way (lowest urgency, latest arrival); swapped when its
    blocks fit in the CPU pool, else recomputed (modes auto and swap: without CPU room, nothing
    else would let the others run)."""

    def victim(self, running: Sequence[R]) -> R:
        return running[-1]

    def swaps(self, victim: Holding, num_cpu_free: int) -> bool:
        return 0 < victim.num_blocks - victim.num_released <= num_cpu_free


class Recompute(SwapWhenRoom):
    """The same victim, always freed: no swap traffic; its tokens are computed again."""

    def swaps(self, victim: Holding, num_cpu_free: int) -> bool:
        return False


PREEMPTION_POLICIES: dict[str, type[PreemptionPolicy]] = {
    "auto": SwapWhenRoom,
    "swap": SwapWhenRoom,
    "recompute": Recompute,
}


def make_preemption_policy(mode: str) -> PreemptionPolicy:
    if mode not in PREEMPTION_POLICIES:
        raise ValueError(
            f"preemption_mode must be one of {', '.join(PREEMPTION_POLICIES)}; got {mode!r}"
        )
    return PREEMPTION_POLICIES[mode]()
