"""Facts about steps that only the scheduler knows, kept for metrics: when each request was
first scheduled (vLLM's SCHEDULED event, for the queue/prefill/inference times on its terminal
event) and how many tokens each step computes (vLLM's iteration_tokens_total).

No clock: "when" is the latest time the scheduler has seen in a message as it plans the step
(an arrival when it was idle, else the previous step's result), so a replay gives the same.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from troupe.actors.core.request_state import Request
from troupe.messages.events import STEP_TOKEN_BUCKETS
from troupe.messages.executor import StepPlan
from troupe.messages.streamer import FirstScheduled


class StepFacts:
    """Fed once per planned step; read by the scheduler's TokenBatch and EngineStats."""

    def __init__(self) -> None:
        self._scheduled: list[str] = []  # first scheduled since the last TokenBatch
        self._scheduled_time = 0.0
        self._steps_by_tokens = [0] * (len(STEP_TOKEN_BUCKETS) + 1)
        self.num_steps = 0  # planned steps counted
        self.num_step_tokens = 0

    def on_plan(self, plan: StepPlan, requests: Iterable[Request], time: float) -> None:
        """A step is planned at `time`: `requests` are the ones it computes."""
        num_tokens = sum(len(s.token_ids) + len(s.draft_token_ids) for s in plan.seqs)
        self._steps_by_tokens[bisect.bisect_left(STEP_TOKEN_BUCKETS, num_tokens)] += 1
        self.num_steps += 1
        self.num_step_tokens += num_tokens
        for req in requests:
            if not req.was_scheduled:
                req.was_scheduled = True
                self._scheduled.append(req.request_id)
                self._scheduled_time = time

    def take_scheduled(self) -> FirstScheduled | None:
        """The requests first scheduled since the last call (one plan's: one time)."""
        if not self._scheduled:
            return None
        ids, self._scheduled = tuple(self._scheduled), []
        return FirstScheduled(self._scheduled_time, ids)

    @property
    def steps_by_tokens(self) -> tuple[int, ...]:
        return tuple(self._steps_by_tokens) if self.num_steps else ()
