"""Preemption policy: which running request gives way when GPU blocks run out, and how: swapped
out to the CPU pool (its KV kept) or freed and recomputed later.

A new policy: a class, its entry in PREEMPTION_POLICIES and its name in config.PreemptionMode
(the check below fails until both agree), and a test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, get_args

from troupe.config import PreemptionMode

if TYPE_CHECKING:
    from troupe.actors.core.request_state import Request


class PreemptionPolicy(Protocol):
    def victim(self, running: Sequence[Request]) -> Request: ...  # `running`: queue order
    def swaps(self, victim: Request, num_cpu_free: int) -> bool: ...  # else: recompute


class SwapWhenRoom:
    """The last in queue order gives way (lowest urgency, latest arrival); swapped when its
    blocks fit in the CPU pool, else recomputed (modes auto and swap: without CPU room, nothing
    else would let the others run)."""

    def victim(self, running: Sequence[Request]) -> Request:
        return running[-1]

    def swaps(self, victim: Request, num_cpu_free: int) -> bool:
        return 0 < victim.num_blocks - victim.num_released <= num_cpu_free


class Recompute(SwapWhenRoom):
    """The same victim, always freed: no swap traffic; its tokens are computed again."""

    def swaps(self, victim: Request, num_cpu_free: int) -> bool:
        return False


PREEMPTION_POLICIES: dict[str, type[PreemptionPolicy]] = {
    "auto": SwapWhenRoom,
    "swap": SwapWhenRoom,
    "recompute": Recompute,
}
assert set(PREEMPTION_POLICIES) == set(get_args(PreemptionMode)), "config.PreemptionMode differs"


def make_preemption_policy(mode: str) -> PreemptionPolicy:
    if mode not in PREEMPTION_POLICIES:
        raise ValueError(
            f"preemption_mode must be one of {', '.join(PREEMPTION_POLICIES)}; got {mode!r}"
        )
    return PREEMPTION_POLICIES[mode]()
