"""Executor core: runs each StepPlan on the runner and answers one StepResult.

A masked plan meets its TokenMasks from the grammar actor here, in any order: the fresh ones of
its own step (`awaits_masks`) and those the grammar filled ahead from the step before
(`ahead_masks_of`). The plan is launched at once (the forward pass runs while the masks are
computed) and sampled under the masks when all are in. The tokens sampled under masks go to
the grammar actor first (GrammarTokens), then the StepResult to the scheduler: the grammar
fills the next masks while the scheduler plans the next step (actors/core/grammar.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import msgspec
import structlog
from troupe.actors.core.base import Outgoing
from troupe.actors.core.executor_profile import StepProfiler
from troupe.actors.core.executor_sleep import from_staged, run_sleep_call, sleeper_of
from troupe.gpu.runner import HiddenOutputs, Runner, SequencesFailed, WeightsRefused
from troupe.gpu.runner_dead import runner_dead
from troupe.gpu.token_bitmask import join_masks
from troupe.messages import (
    ExecutorInbox,
    FailedSeq,
    GrammarTokens,
    Phase,
    PhaseStepResult,
    SampledToken,
    SeqFailureReason,
    StepPlan,
    StepResult,
    TokenMasks,
)
from troupe.messages.engine_calls import UpdateWeights, WeightsErrorCode, WeightsLoaded
from troupe.messages.profile_calls import StartProfile, StopProfile
from troupe.messages.sleep_calls import Sleep, WakeUp

log = structlog.get_logger("troupe.executor")

_Ran = tuple[StepResult, TokenMasks | None]  # a step's result and the masks it sampled under


class ExecutorCore:
    """Inbox: StepPlan, TokenMasks, UpdateWeights, Sleep, WakeUp, StartProfile, StopProfile.
    Outbox: "scheduler" (StepResult; "phase_router" with disaggregation; WeightsLoaded,
    SleepDone, ProfileReply), "grammar"
    (GrammarTokens, one per step sampled under masks).

    A runner exception fails only that step: the scheduler turns the error into Failed events
    for the step's requests and the engine keeps serving the others. A sequence the runner
    could not sample (SequencesFailed: non-finite logits) fails alone, in `StepResult.failed`,
    as does one whose grammar failed (TokenMasks.failed). A runner that can never step again
    (gpu/runner_dead.py: a tensor-parallel rank gone, a poisoned CUDA context) raises
    RunnerDead out of `handle`: the actor stops and the engine turns dead (every open request
    fails with its message, actors/engine_death.py).
    """

    def __init__(
        self,
        runner: Runner,
        clock: Callable[[], float] = time.monotonic,
        *,
        phase: Phase | None = None,
        draw_ahead: Callable[[TokenMasks], None] | None = None,
        reload_weights: Callable[[str], str] | None = None,
        profiler_dir: str | None = None,
    ) -> None:
        """`phase`: one side of prefill/decode disaggregation; its results then go to the
        phase router ("phase_router", PhaseStepResult) instead of the scheduler. `draw_ahead`:
        the runner's (gpu/runner.DrawsAhead), given the masks filled ahead that come before
        their plan. `reload_weights(path)`: the runner's (gpu/runner.ReloadsWeights), for
        UpdateWeights (None: refused), which the scheduler sends only with no step out.
        `profiler_dir`: where StopProfile writes its trace (None: profiling is off)."""
        self.runner = runner
        self._reload_weights = reload_weights
        self._sleeper = sleeper_of(runner)  # sleep mode (actors/core/executor_sleep.py)
        self.profiler = StepProfiler(profiler_dir)  # actors/core/executor_profile.py
        self.phase = phase
        self._draw_ahead = draw_ahead
        self._clock = clock
        self.busy_seconds = 0.0  # time inside the runner, for overhead benchmarks
        self._launched: StepPlan | None = None  # awaiting its masks
        self._launch_error: str | None = None
        self._fresh: TokenMasks | None = None  # the latest masks of a step (maybe before it)
        self._ahead: TokenMasks | None = None  # the latest masks filled ahead

    def handle(self, batch: Sequence[ExecutorInbox]) -> Outgoing:
        out: Outgoing = []
        for msg in batch:
            if isinstance(msg, UpdateWeights):
                out.append(("scheduler", self._update_weights(msg)))
                continue
            if isinstance(msg, Sleep | WakeUp):  # no step out (the scheduler sends it so)
                out.append(("scheduler", run_sleep_call(self._sleeper, msg)))
                continue
            if isinstance(msg, StartProfile | StopProfile):  # between two steps
                out.append(("scheduler", self.profiler.handle(msg)))
                continue
            start = time.perf_counter()
            ran = self._on_masks(msg) if isinstance(msg, TokenMasks) else self._on_plan(msg)
            self.busy_seconds += time.perf_counter() - start
            if ran is None:
                continue
            result, masks = ran
            if masks is not None and result.sampled:
                out.append(("grammar", _grammar_tokens(result, masks)))
            if self.phase is None:
                out.append(("scheduler", result))
            else:
                out.append(("phase_router", PhaseStepResult(phase=self.phase, result=result)))
        return out

    def _on_plan(self, plan: StepPlan) -> _Ran | None:
        if not plan.is_masked:
            return self._run(plan.step_id, lambda: self.runner.execute(plan)), None
        self._launched, self._launch_error = plan, None
        try:
            self.runner.launch(plan)
        except Exception as exc:
            _raise_if_dead(exc, plan.step_id)
            log.exception("step failed", step_id=plan.step_id)
            self._launch_error = f"{type(exc).__name__}: {exc}"
            self._drop_hidden_outputs()
        return self._sample()

    def _on_masks(self, masks: TokenMasks) -> _Ran | None:
        if masks.ahead:
            self._ahead = masks
            if self._launched is None and self._draw_ahead is not None:
                try:  # the plan is most likely the kept step: draw it now, it confirms
                    self._draw_ahead(masks)
                except Exception:  # the plan then runs as if nothing was drawn
                    log.exception("drawing ahead failed", step_id=masks.step_id)
        else:
            self._fresh = masks
        return self._sample()

    def _sample(self) -> _Ran | None:
        """Sample the launched plan once all its masks are in (None while any is missing)."""
        plan, fresh, ahead = self._launched, self._fresh, self._ahead
        if plan is None:
            return None
        if plan.awaits_masks and (fresh is None or fresh.step_id != plan.step_id):
            return None
        if plan.ahead_masks_of is not None and (
            ahead is None or ahead.step_id != plan.ahead_masks_of
        ):
            return None
        self._launched = None
        if self._launch_error is not None:
            error = StepResult(step_id=plan.step_id, time=self._clock(), error=self._launch_error)
            return error, None
        used = (
            ahead if plan.ahead_masks_of is not None else None,
            fresh if plan.awaits_masks else None,
        )
        parts = [m for m in used if m is not None]  # a fresh row wins over an ahead one
        masks = parts[0] if len(parts) == 1 else join_masks(parts[0], parts[1])
        result = self._run(plan.step_id, lambda: self.runner.finish(masks))
        if not masks.failed:
            return result, masks
        return _grammar_failures(result, masks, set(masks.dead_ends)), masks

    def _run(self, step_id: int, step: Callable[[], tuple[SampledToken, ...]]) -> StepResult:
        try:
            sampled = step()
        except SequencesFailed as exc:  # the step ran: the others' tokens are good
            log.warning("sequences failed", step_id=step_id, failed=str(exc))
            return StepResult(
                step_id=step_id,
                time=self._clock(),
                sampled=exc.sampled,
                failed=exc.failed,
                **_hidden_fields(self.runner.take_hidden_outputs()),
            )
        except Exception as exc:
            _raise_if_dead(exc, step_id)
            log.exception("step failed", step_id=step_id)
            self._drop_hidden_outputs()
            return StepResult(
                step_id=step_id, time=self._clock(), error=f"{type(exc).__name__}: {exc}"
            )
        hidden = _hidden_fields(self.runner.take_hidden_outputs())
        return StepResult(step_id=step_id, time=self._clock(), sampled=sampled, **hidden)

    def _update_weights(self, msg: UpdateWeights) -> WeightsLoaded:
        call_id = msg.call_id
        if self._reload_weights is None:
            message = "this runner cannot replace its weights (the fake runner, a wrapped one)"
            return WeightsLoaded(
                call_id=call_id, message=message, error=WeightsErrorCode.UNSUPPORTED
            )
        try:
            if msg.from_tensors:  # staged by the engine (Engine.update_weights_from_tensors)
                message = from_staged(self.runner, call_id)
            else:
                message = self._reload_weights(msg.model_path)
        except WeightsRefused as exc:
            log.warning("weight update refused", model_path=msg.model_path, reason=str(exc))
            return WeightsLoaded(call_id=call_id, message=str(exc), error=exc.code)
        except Exception as exc:  # a bug, or a read failing: the weights may be mixed
            _raise_if_dead(exc, None)
            log.exception("weight update failed", model_path=msg.model_path)
            message = f"loading {msg.model_path!r} failed: {type(exc).__name__}: {exc}"
            return WeightsLoaded(call_id=call_id, message=message, error=WeightsErrorCode.FAILED)
        log.info("weights updated", model_path=msg.model_path, summary=message)
        return WeightsLoaded(call_id=call_id, message=message)

    def _drop_hidden_outputs(self) -> None:
        """A failed step's prompt logprobs and embeddings (its requests fail): none may reach
        a later step."""
        try:
            self.runner.take_hidden_outputs()
        except Exception:
            log.exception("dropping a failed step's hidden outputs failed")


def _raise_if_dead(exc: Exception, step_id: int | None) -> None:
    """Raise `exc` as RunnerDead if the runner can never step again (else return)."""
    dead = runner_dead(exc)
    if dead is None:
        return
    log.error("runner dead", step_id=step_id, error=str(dead), exc_info=exc)
    if dead is exc:
        raise dead
    raise dead from exc


def _hidden_fields(hidden: HiddenOutputs) -> dict[str, Any]:
    return {"prompt_logprobs": hidden.prompt_logprobs, "embeddings": hidden.embeddings}


def _grammar_tokens(result: StepResult, masks: TokenMasks) -> GrammarTokens:
    """The tokens of `result` that the grammar matches: its constrained rows' (none failed)."""
    constrained = set(masks.request_ids)
    sampled = [s for s in result.sampled if s.request_id in constrained]
    return GrammarTokens(
        step_id=result.step_id,
        request_ids=tuple(s.request_id for s in sampled),
        token_ids=tuple(s.token_id for s in sampled),
    )


def _grammar_failures(
    result: StepResult, masks: TokenMasks, dead_ends: Collection[str] = ()
) -> StepResult:
    """`result` with the requests whose grammar failed moved from `sampled` to `failed`
    (`dead_ends`: those whose grammar allowed no token, the client's fault, with the why).

    Only those fail: a grammar that ended with a stop token names its request in the masks of
    the step after, which that request (finished at the stop token) is not part of."""
    if result.error is not None:
        return result
    broken = dict(masks.failed)
    failed = []
    for s in result.sampled:
        if s.request_id in broken:
            reason = broken[s.request_id]
            log.warning("structured output failed", request_id=s.request_id, reason=reason)
            if s.request_id in dead_ends:
                failed.append(FailedSeq(s.request_id, SeqFailureReason.GRAMMAR_DEAD_END, reason))
            else:
                failed.append(FailedSeq(s.request_id, SeqFailureReason.GRAMMAR))
    return msgspec.structs.replace(  # the others' prompt logprobs and embeddings stay
        result,
        sampled=tuple(s for s in result.sampled if s.request_id not in broken),
        failed=result.failed + tuple(failed),
    )
