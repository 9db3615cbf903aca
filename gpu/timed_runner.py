"""TimedRunner: wraps any runner and stamps each step's start and end (the step timeline).

`ops/burst_steps.py` runs issue 9's burst through it to see where a burst's time goes: when
each step ran, how many sequences and tokens it carried, how many of those sequences were
prefill chunks. On CUDA with overlap a step's `execute` returns once that step's samples are
on the host, while the next decode step already runs, so the gap between one step's end and
the next one's start is the actors' planning, not necessarily idle GPU.

Like FaultyRunner, it blocks its caller: the engine runs an injected runner in a worker thread.
It does not pass on `draw_ahead` (gpu/runner.DrawsAhead): a timed engine draws masked steps
when their plan comes, whatever `EngineConfig.draw_masked_ahead` says.
"""

from __future__ import annotations

import dataclasses
import time

from troupe.gpu.runner import Runner
from troupe.gpu.runner_wrapper import RunnerWrapper
from troupe.messages import SampledToken, StepPlan, TokenMasks


@dataclasses.dataclass(frozen=True)
class StepTime:
    """One step: perf_counter seconds at its start and end, and what it carried."""

    step_id: int
    start: float
    end: float
    num_seqs: int
    num_tokens: int
    num_prefill_seqs: int  # sequences with more than one new token (prefill chunks)


class TimedRunner(RunnerWrapper):
    """A Runner that delegates to `inner` and appends a StepTime per step to `steps`."""

    def __init__(self, inner: Runner) -> None:
        super().__init__(inner)
        self.steps: list[StepTime] = []
        self._launched: tuple[StepPlan, float] | None = None

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        start = time.perf_counter()
        try:
            return self.inner.execute(plan)
        finally:
            self._record(plan, start)

    def launch(self, plan: StepPlan) -> None:
        self._launched = (plan, time.perf_counter())
        self.inner.launch(plan)

    def finish(self, masks: TokenMasks) -> tuple[SampledToken, ...]:
        try:
            return self.inner.finish(masks)
        finally:
            if self._launched is not None:
                self._record(*self._launched)
                self._launched = None

    def _record(self, plan: StepPlan, start: float) -> None:
        seqs = plan.seqs
        num_prefill = sum(1 for s in seqs if len(s.token_ids) > 1)
        step = StepTime(
            plan.step_id, start, time.perf_counter(), len(seqs), plan.num_tokens, num_prefill
        )
        self.steps.append(step)
