"""Queue policy: the order requests are served in, and read backwards, preempted in.

Each queue (waiting, running, swapped) stays sorted by the policy's key, lowest first, computed
once when a request arrives. A new policy: a class, its entry in QUEUE_POLICIES and its name in
config.QueuePolicyName (the check below fails until both agree), and a test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, get_args

from troupe.config import QueuePolicyName

if TYPE_CHECKING:
    from troupe.actors.core.request_state import Request


class QueuePolicy(Protocol):
    def sort_key(self, req: Request) -> tuple[int, ...]: ...


class Fcfs:
    """First come, first served; `priority` is ignored."""

    def sort_key(self, req: Request) -> tuple[int, ...]:
        return (req.arrival_seq,)


class Priority:
    """Lower `priority` value first (as in vLLM), first come first served within one value."""

    def sort_key(self, req: Request) -> tuple[int, ...]:
        return (req.params.priority, req.arrival_seq)


QUEUE_POLICIES: dict[str, type[QueuePolicy]] = {"fcfs": Fcfs, "priority": Priority}
assert set(QUEUE_POLICIES) == set(get_args(QueuePolicyName)), "config.QueuePolicyName differs"


def make_queue_policy(name: str) -> QueuePolicy:
    if name not in QUEUE_POLICIES:
        raise ValueError(
            f"scheduling_policy must be one of {', '.join(QUEUE_POLICIES)}; got {name!r}"
        )
    return QUEUE_POLICIES[name]()
