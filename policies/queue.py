"""Queue policy: the order requests are served in, and read backwards, preempted in.

Each queue (waiting, running, swapped) stays sorted by the policy's key, lowest first, computed
once when a request arrives. A new policy: a class and its entry in QUEUE_POLICIES (config
checks `scheduling_policy` against it), and a test.
"""

from __future__ import annotations

from typing import Protocol

from troupe.messages.sampling import SamplingParams


class Queued(Protocol):
    """What a queue policy reads of a request (actors/core/request_state.Request)."""

    @property
    def arrival_seq(self) -> int: ...
    @property
    def params(self) -> SamplingParams: ...


class QueuePolicy(Protocol):
    def sort_key(self, req: Queued) -> tuple[int, ...]: ...


class Fcfs:
    """First come, first served; `priority` is ignored."""

    def sort_key(self, req: Queued) -> tuple[int, ...]:
        return (req.arrival_seq,)


class Priority:
    """Lower `priority` value first (as in vLLM), first come first served within one value."""

    def sort_key(self, req: Queued) -> tuple[int, ...]:
        return (req.params.priority, req.arrival_seq)


QUEUE_POLICIES: dict[str, type[QueuePolicy]] = {"fcfs": Fcfs, "priority": Priority}


def make_queue_policy(name: str) -> QueuePolicy:
    if name not in QUEUE_POLICIES:
        raise ValueError(
            f"scheduling_policy must be one of {', '.join(QUEUE_POLICIES)}; got {name!r}"
        )
    return QUEUE_POLICIES[name]()
