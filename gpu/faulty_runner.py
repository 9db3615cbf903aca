"""FaultyRunner: wraps any runner to inject faults at chosen steps, and to hold steps.

Tests and the soak harness use it to prove that a failure stays contained (a raising step fails
only its requests, a request whose logits turn non-finite fails alone, a hung step is caught by
the engine's watchdog, a runner that dies turns the engine dead), and to make timing-dependent
scenarios deterministic: `hold_after(n)` lets `n` more steps run, then blocks the next one until
`release()` -- a stream is then certain to outlive a drain grace, however fast the machine.

Steps are counted from 1 over `execute` calls. The wrapper blocks its caller, so the engine runs
an injected runner's steps in a worker thread (never on the event loop).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping

from troupe.gpu.runner import Runner, SequencesFailed
from troupe.gpu.runner_dead import RunnerDead
from troupe.gpu.runner_wrapper import RunnerWrapper
from troupe.messages import FailedSeq, SampledToken, SeqFailureReason, StepPlan


class InjectedFault(RuntimeError):
    """The error a FaultyRunner raises at a step in `fail_at_steps`."""


class InjectedDeath(RunnerDead):
    """What a FaultyRunner raises from `dead_at_step` on: it can never step again."""


class FaultyRunner(RunnerWrapper):
    """A Runner that delegates to `inner`, except at the steps it was told to break."""

    def __init__(
        self,
        inner: Runner,
        *,
        fail_at_steps: Collection[int] = (),
        hang_at_step: int | None = None,
        nan_at: Mapping[int, Collection[str]] | None = None,
        dead_at_step: int | None = None,
    ) -> None:
        """`nan_at`: step -> request ids whose logits come out non-finite at that step (as the
        real sampler reports them: no token, a FailedSeq); ids not sampled then are unaffected.
        `dead_at_step`: that step and every later one raise InjectedDeath (a RunnerDead)."""
        super().__init__(inner)
        self._dead_at = dead_at_step
        self._fail_at = frozenset(fail_at_steps)
        self._nan_at = {step: frozenset(ids) for step, ids in (nan_at or {}).items()}
        self._cond = threading.Condition()
        self._hold_at: int | None = hang_at_step  # the first step that must wait for release()
        self.num_steps = 0  # execute calls so far (the one in progress included)
        self.num_held = 0  # steps that are waiting (or waited) at the gate
        self.is_waiting = False

    def hold_after(self, num_steps: int) -> None:
        """Let `num_steps` more steps run, then hold the next one until `release()`. A step
        held now runs first (it is not one of the `num_steps`)."""
        with self._cond:
            self._hold_at = self.num_steps + num_steps + 1
            self._cond.notify_all()

    def release(self) -> None:
        """Let held steps (and all later ones) run."""
        with self._cond:
            self._hold_at = None
            self._cond.notify_all()

    def wait_until_held(self, timeout: float | None = None, num_held: int = 1) -> bool:
        """Block until a step waits at the gate, the `num_held`-th to do so (True), or
        `timeout` seconds pass (False)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self.is_waiting and self.num_held >= num_held, timeout
            )

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        with self._cond:
            self.num_steps += 1
            step = self.num_steps
            if self._hold_at is not None and step >= self._hold_at:
                self.num_held += 1
                self.is_waiting = True
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._hold_at is None or step < self._hold_at)
                self.is_waiting = False
        if step in self._fail_at:
            raise InjectedFault(f"fault injected at step {step}")
        if self._dead_at is not None and step >= self._dead_at:
            raise InjectedDeath(f"the runner died at step {self._dead_at} (injected)")
        sampled = self.inner.execute(plan)
        poisoned = self._nan_at.get(step)
        if poisoned is None or not any(s.request_id in poisoned for s in sampled):
            return sampled
        raise SequencesFailed(
            tuple(s for s in sampled if s.request_id not in poisoned),
            tuple(
                FailedSeq(s.request_id, SeqFailureReason.NON_FINITE_LOGITS)
                for s in sampled
                if s.request_id in poisoned
            ),
        )

    def close(self) -> None:
        self.release()
        self.inner.close()
