"""The live requests of each LoRA adapter, counted on the running side (running, awaiting a late
token: seated, as lora_slots counts them) and on the queued side (waiting, swapped).

RequestQueues updates the counts where a request enters or leaves one of its queues, so the
scheduler's stats (scheduler_stats.py, once per step) and the max_loras gate name the adapters in
use at the cost of the adapters, not of a scan of every queue: thousands of waiting requests
would cost every step.

    enqueue(a1, WAITING)   queued {a: 1}
    move(a1, RUNNING)      running {a: 1}   queued {}
    finish(a1)             running {}
"""

from __future__ import annotations

from troupe.actors.core.request_state import Request, Status

_RUNNING_SIDE = frozenset({Status.RUNNING, Status.AWAITING})
_QUEUED_SIDE = frozenset({Status.WAITING, Status.SWAPPED})


class AdapterCounts:
    """Requests per adapter name on each side; an adapter no request names is not a key.
    Requests of the base model (no adapter) are not counted."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.queued: dict[str, int] = {}

    def entered(self, req: Request, status: Status) -> None:
        """`req` joined the queue of `status`."""
        if (lora := req.params.lora) is not None:
            side = self._side(status)
            side[lora] = side.get(lora, 0) + 1

    def left(self, req: Request, status: Status) -> None:
        """`req` left the queue of `status`."""
        if (lora := req.params.lora) is not None:
            side = self._side(status)
            num = side[lora] - 1
            assert num >= 0, f"adapter {lora!r}: {req.request_id} left a queue it was not in"
            if num:
                side[lora] = num
            else:
                del side[lora]

    def names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The adapters of the running requests and of the queued ones, each sorted."""
        return tuple(sorted(self.running)), tuple(sorted(self.queued))

    def _side(self, status: Status) -> dict[str, int]:
        if status in _RUNNING_SIDE:
            return self.running
        assert status in _QUEUED_SIDE, f"no queue for status {status}"
        return self.queued
