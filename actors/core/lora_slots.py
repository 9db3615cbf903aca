"""At most `max_loras` distinct LoRA adapters among the running requests, so that any step runs
at most that many (the runner holds that many adapters' weights at once).

The gate is where requests start (step_starts.py): a queued request whose adapter is not
already running waits while max_loras adapters run. A waiting one steps aside (later requests
of a running adapter, or of the base model, may start; it keeps its place in the queue), a
swapped one stops the swapped requests as a shortage of blocks does. Recomputed requests
re-enter waiting and pass the same gate; a parallel-sampling parent's samples share its
adapter. Requests awaiting a late token count too: they run again without starting.

    max_loras 1, running: a a None     waiting: b a None  ->  a and None start, b waits
"""

from __future__ import annotations

from troupe.actors.core.request_queues import RequestQueues
from troupe.actors.core.request_state import Request


class AdapterSlots:
    """One step's view of the adapters the running requests use (those started in the step
    included): the queues' counts (adapter_counts.py), copied at the first queued request
    that names an adapter."""

    def __init__(self, queues: RequestQueues, max_loras: int) -> None:
        self.queues, self.max_loras = queues, max_loras
        self._names: set[str] | None = None  # None: not counted yet

    def admits(self, req: Request) -> bool:
        """Whether `req` may start beside the running requests."""
        lora = req.params.lora
        if lora is None:
            return True
        if (names := self._names) is None:
            names = self._names = set(self.queues.adapters.running)
        return lora in names or len(names) < self.max_loras

    def started(self, req: Request) -> None:
        """`req` started (now in the running queue: a count made later sees it)."""
        if self._names is not None and (lora := req.params.lora) is not None:
            self._names.add(lora)
