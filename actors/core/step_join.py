"""One StepResult from the two executors' answers to their shares of a step.

The scheduler expects a token for each sampled SeqWork in its plan's order; the two shares
keep their relative order, so the join looks each request up in the answers by id and walks
the plan. An error on either side fails the whole step (the scheduler fails its requests).

A step with a decode share is answered when the decode side is: the prefill side works
through its queue of shares at its own pace (each side runs its shares in step order, and
transfers pair up by step, so what a later share reads is there when it runs), and the
decodes never wait for a prompt's compute (TTFT and TPOT are tuned apart).

    prefill share samples nothing ─► not awaited; only its error matters (below)
    prefill share samples (a prompt's last chunk), decode share too
        prefill answered first ─► joined into the step's result, as one executor answers
        decode answered first ──► the result names those requests `late`; their tokens go
                                  out as LateTokens just before the next result, or alone
                                  at once when no step is in flight (nothing waits on it)
    prefill share samples, no decode share ─► awaited (nothing else would answer the step)

A prefill share that is not awaited can only fail with its worker (a runner error ends the
pair): its requests fail (LateTokens.error), the next step answered fails, and the pair fails
every step after it.
"""

from __future__ import annotations

import dataclasses

from troupe.messages.phase_router import Phase
from troupe.messages.scheduler import FailedSeq, LateTokens, SampledToken, StepResult

ToScheduler = StepResult | LateTokens


@dataclasses.dataclass(eq=False)
class StepJoin:
    """The answers awaited for one step."""

    step_id: int
    order: tuple[str, ...]  # the plan's sampled requests, in plan order
    waiting: set[Phase]
    late: tuple[str, ...] = ()  # sampled on an unawaited prefill share, in plan order
    results: dict[Phase, StepResult] = dataclasses.field(default_factory=dict)

    def expects(self, phase: Phase) -> bool:
        return phase in self.waiting or (phase == Phase.PREFILL and bool(self.late))

    def add(self, phase: Phase, result: StepResult) -> bool:
        """Take one side's answer; True once every awaited one is in."""
        self.waiting.discard(phase)
        self.results[phase] = result
        if phase == Phase.PREFILL:
            self.late = ()  # in time: joined
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
            late=self.late,
        )


class StepJoins:
    """Steps in flight, the prefill shares answered ahead or late, and the latest time."""

    def __init__(self) -> None:
        self._joins: dict[int, StepJoin] = {}
        self._ahead: set[int] = set()  # steps whose prefill share runs on unawaited
        self._late: dict[int, tuple[str, ...]] = {}  # answered steps: requests still sampling
        self._held: list[LateTokens] = []  # late tokens for the next result
        self._late_error: str | None = None
        self.time = 0.0  # the latest time an executor stamped
        self.num_answered_ahead = 0
        self.num_late = 0  # requests whose token came after their step's result

    @property
    def num_ahead(self) -> int:
        """Prefill shares still running after their step was answered."""
        return len(self._ahead) + len(self._late)

    def start(
        self,
        step_id: int,
        order: tuple[str, ...],
        shares: set[Phase],
        prefill_sampled: tuple[str, ...] = (),
    ) -> list[ToScheduler]:
        """A step sent to `shares` (`prefill_sampled`: the requests its prefill share samples,
        in plan order); its result now if it awaits nothing."""
        if step_id in self._joins or step_id in self._ahead or step_id in self._late:
            raise ValueError(f"step {step_id} is already running")
        if Phase.DECODE in shares:
            awaited, late = {Phase.DECODE}, prefill_sampled
        else:
            awaited, late = ({Phase.PREFILL} if prefill_sampled else set()), ()
        if Phase.PREFILL in shares - awaited and not late:
            self._ahead.add(step_id)
            self.num_answered_ahead += 1
        join = StepJoin(step_id, order, awaited, late)
        if not awaited:
            return self._done(join)
        self._joins[step_id] = join
        return []

    def answer(self, phase: Phase, result: StepResult) -> list[ToScheduler]:
        """One side's answer; what goes to the scheduler now (maybe nothing)."""
        self.time = max(self.time, result.time)
        step_id = result.step_id
        if phase == Phase.PREFILL and step_id in self._ahead:
            self._ahead.discard(step_id)
            self._note_error(step_id, result)
            return []
        if phase == Phase.PREFILL and step_id in self._late:
            return self._late_tokens(self._late.pop(step_id), result)
        join = self._joins.get(step_id)
        if join is None or not join.expects(phase):
            raise ValueError(f"an answer of the {phase} side to step {step_id}, not awaited")
        if not join.add(phase, result):
            return []
        del self._joins[step_id]
        return self._done(join)

    def _late_tokens(self, request_ids: tuple[str, ...], result: StepResult) -> list[ToScheduler]:
        self._note_error(result.step_id, result)
        self.num_late += len(request_ids)
        late = LateTokens(
            step_id=result.step_id,
            time=self.time,
            request_ids=request_ids,
            sampled=result.sampled,
            failed=result.failed,
            error=None if result.error is None else f"prefill executor: {result.error}",
        )
        if self._joins:  # a step in flight: with its result
            self._held.append(late)
            return []
        return [late]

    def _note_error(self, step_id: int, result: StepResult) -> None:
        if result.error is not None and self._late_error is None:
            self._late_error = f"prefill executor (step {step_id}): {result.error}"

    def _done(self, join: StepJoin) -> list[ToScheduler]:
        late_error, self._late_error = self._late_error, None
        result = join.joined(self.time, late_error)
        if join.late and result.error is None:
            self._late[join.step_id] = join.late
        elif join.late:  # the step failed with its late requests: their answer is not wanted
            self._ahead.add(join.step_id)
        held, self._held = self._held, []
        return [*held, result]
