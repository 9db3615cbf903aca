"""The scheduler's live requests by id, in four queues (waiting, running, swapped, awaiting a
late token) each sorted by the queue policy's key (policies/queue.py), and the ended requests
whose blocks (`to_free`) or executor state (`released`) the next step lets go of.

Requests enter and leave the queues only through these methods (the queues are read-only
Sequences to everyone else), so that `adapters` (adapter_counts.py) counts them exactly."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from operator import attrgetter

from troupe.actors.core.adapter_counts import AdapterCounts
from troupe.actors.core.request_state import Request, Status
from troupe.policies.queue import QueuePolicy


class RequestQueues:
    """Live requests by id, in four queues sorted by `sort_key`; ended requests whose blocks
    (`to_free`) or executor state (`released`) the next step releases."""

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.requests: dict[str, Request] = {}
        queued = (Status.WAITING, Status.RUNNING, Status.SWAPPED, Status.AWAITING)
        self._queues: dict[Status, list[Request]] = {status: [] for status in queued}
        # awaiting (a late token): a seat and blocks, never planned nor a preemption victim
        self.waiting: Sequence[Request]
        self.running: Sequence[Request]
        self.swapped: Sequence[Request]
        self.awaiting: Sequence[Request]
        self.waiting, self.running, self.swapped, self.awaiting = self._queues.values()
        self.adapters = AdapterCounts()  # the LoRA adapters of the requests in each queue
        self.to_free: dict[str, Request] = {}
        self.released: list[str] = []

    def add(self, req: Request) -> None:
        req.sort_key = self.policy.sort_key(req)
        self.enqueue(req, Status.WAITING)  # first: it may raise (keys that do not compare)
        self.requests[req.request_id] = req

    def enqueue(self, req: Request, status: Status) -> None:
        req.status = status
        bisect.insort(self._queues[status], req, key=attrgetter("sort_key"))
        self.adapters.entered(req, status)

    def take(self, req: Request) -> Request:
        """`req` out of its queue, its status kept: the caller enqueues it again (a request
        set aside for a step) or ends it."""
        self._queues[req.status].remove(req)
        self.adapters.left(req, req.status)
        return req

    def move(self, req: Request, status: Status) -> None:
        self.enqueue(self.take(req), status)

    def finish(self, req: Request) -> None:
        """End a request: out of its queue; blocks and executor state released next step."""
        if req.status != Status.FINISHED:
            self.take(req)
            req.status = Status.FINISHED
            del self.requests[req.request_id]
            if req.in_allocator:
                self.to_free[req.request_id] = req
            if req.in_executor:
                self.released.append(req.request_id)

    def recompute(self, req: Request) -> None:
        """Back to waiting with nothing computed (its blocks are freed)."""
        req.num_computed = req.num_committed_blocks = req.num_cpu_blocks = 0
        self.move(req, Status.WAITING)

    def find(self, request_id: str) -> Request | None:
        """A request the allocator may hold blocks for: live, or ended and not yet freed."""
        return self.requests.get(request_id) or self.to_free.get(request_id)
