"""One StepResult from the two executors' answers to their shares of a step.

The scheduler expects a token for each sampled SeqWork in its plan's order; the two shares
keep their relative order, so the join looks each request up in the answers by id and walks
the plan. An error on either side fails the whole step (the scheduler fails its requests).

A prefill share that samples nothing (chunks in the middle of prompts, releases, blocks to
send) is not awaited: the step is answered when the decode side is, and the prefill side
works through its queue of shares at its own pace (each side runs its shares in step order,
and transfers pair up by step, so what a later share reads is there when it runs). Such a
share can only fail with its worker (a runner error ends the pair), so a late error fails the
next step answered, and the pair fails every step after it.
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

    def add(self, phase: Phase, result: StepResult) -> bool:
        """Take one side's answer; True once every awaited one is in."""
        self.waiting.discard(phase)
        self.results[phase] = result
        return not self.waiting

    def joined(self, time: float, late_error: str | None) -> StepResult:
        parts = [self.results[p] for p in Phase if p in self.results]
        errors = [f"{p} executor: {r.error}" for p, r in self.results.items() if r.error]
        if late_error is not None:
            errors.append(late_error)
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


class StepJoins:
    """Steps in flight, the prefill shares answered ahead, and the latest executor time."""

    def __init__(self) -> None:
        self._joins: dict[int, StepJoin] = {}
        self._ahead: set[int] = set()  # steps whose prefill share runs on unawaited
        self._late_error: str | None = None
        self.time = 0.0  # the latest time an executor stamped
        self.num_answered_ahead = 0

    @property
    def num_ahead(self) -> int:
        """Prefill shares still running after their step was answered."""
        return len(self._ahead)

    def start(
        self, step_id: int, order: tuple[str, ...], shares: set[Phase], awaited: set[Phase]
    ) -> StepResult | None:
        """A step sent to `shares`; its result now if it awaits nothing."""
        if step_id in self._joins or step_id in self._ahead:
            raise ValueError(f"step {step_id} is already running")
        if Phase.PREFILL in shares - awaited:
            self._ahead.add(step_id)
            self.num_answered_ahead += 1
        join = StepJoin(step_id, order, set(awaited))
        if not awaited:
            return self._done(join)
        self._joins[step_id] = join
        return None

    def answer(self, phase: Phase, result: StepResult) -> StepResult | None:
        """One side's answer; the step's result once it is complete."""
        self.time = max(self.time, result.time)
        step_id = result.step_id
        if phase == Phase.PREFILL and step_id in self._ahead:
            self._ahead.discard(step_id)
            if result.error is not None and self._late_error is None:
                self._late_error = f"prefill executor (step {step_id}): {result.error}"
            return None
        join = self._joins.get(step_id)
        if join is None or phase not in join.waiting:
            raise ValueError(f"an answer of the {phase} side to step {step_id}, not awaited")
        if not join.add(phase, result):
            return None
        del self._joins[step_id]
        return self._done(join)

    def _done(self, join: StepJoin) -> StepResult:
        late, self._late_error = self._late_error, None
        return join.joined(self.time, late)
