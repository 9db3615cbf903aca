"""One StepResult from the two executors' answers to their shares of a step.

The scheduler expects a token for each sampled SeqWork in its plan's order; the two shares
keep their relative order, so the join looks each request up in the answers by id and walks
the plan. An error on either side fails the whole step (the scheduler fails its requests).
"""

from __future__ import annotations

import dataclasses

from troupe.messages.phase_router import Phase
from troupe.messages.scheduler import FailedSeq, SampledToken, StepResult


@dataclasses.dataclass(eq=False)
class StepJoin:
    """The answers awaited for one step."""

    step_id: int
    order: tuple[str, ...]  # the plan's sampled requests, in plan order
    waiting: set[Phase]
    results: dict[Phase, StepResult] = dataclasses.field(default_factory=dict)

    def add(self, phase: Phase, result: StepResult) -> StepResult | None:
        """Take one side's answer; the joined result once both are in."""
        if phase not in self.waiting:
            raise ValueError(f"step {self.step_id}: unexpected answer from the {phase} side")
        self.waiting.discard(phase)
        self.results[phase] = result
        return None if self.waiting else self.joined()

    def joined(self) -> StepResult:
        parts = [self.results[p] for p in Phase if p in self.results]
        time = max(r.time for r in parts)
        errors = [f"{p} executor: {r.error}" for p, r in self.results.items() if r.error]
        if errors:
            return StepResult(step_id=self.step_id, time=time, error="; ".join(errors))
        sampled: dict[str, SampledToken] = {s.request_id: s for r in parts for s in r.sampled}
        failed: dict[str, FailedSeq] = {f.request_id: f for r in parts for f in r.failed}
        return StepResult(
            step_id=self.step_id,
            time=time,
            sampled=tuple(sampled[rid] for rid in self.order if rid in sampled),
            failed=tuple(failed[rid] for rid in self.order if rid in failed),
        )
