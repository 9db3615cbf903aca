"""Executor core: runs each StepPlan on the runner and answers one StepResult."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog
from troupe.actors.core.base import Outgoing
from troupe.gpu.runner import Runner, SequencesFailed
from troupe.messages import StepPlan, StepResult

log = structlog.get_logger("troupe.executor")


class ExecutorCore:
    """Inbox: StepPlan. Outbox: "scheduler" (StepResult).

    A runner exception fails only that step: the scheduler turns the error into Failed events
    for the step's requests and the engine keeps serving the others. A sequence the runner
    could not sample (SequencesFailed: non-finite logits) fails alone, in `StepResult.failed`.
    """

    def __init__(self, runner: Runner, clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self._clock = clock
        self.busy_seconds = 0.0  # time inside runner.execute, for overhead benchmarks

    def handle(self, batch: Sequence[StepPlan]) -> Outgoing:
        out: Outgoing = []
        for plan in batch:
            start = time.perf_counter()
            try:
                sampled = self.runner.execute(plan)
            except SequencesFailed as exc:  # the step ran: the others' tokens are good
                log.warning("sequences failed", step_id=plan.step_id, failed=str(exc))
                result = StepResult(
                    step_id=plan.step_id, time=self._clock(), sampled=exc.sampled, failed=exc.failed
                )
            except Exception as exc:
                log.exception("step failed", step_id=plan.step_id)
                result = StepResult(
                    step_id=plan.step_id,
                    time=self._clock(),
                    error=f"{type(exc).__name__}: {exc}",
                )
            else:
                result = StepResult(step_id=plan.step_id, time=self._clock(), sampled=sampled)
            self.busy_seconds += time.perf_counter() - start
            out.append(("scheduler", result))
        return out
