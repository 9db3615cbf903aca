"""The executor's side of sleep mode (messages/sleep_calls.py) and of weights from tensors: the
runner's Sleeper and WeightReload called between steps, their outcome as a message.

vLLM's rules: a sleep while asleep, or a wake_up of what is awake, changes nothing and says so;
wake_up with no tags wakes everything asleep. A sleep the runner refuses before freeing anything
(gpu/sleep_state.SleepRefused: a level 2 over kept-quantized weights) answers UNSUPPORTED.
"""

from __future__ import annotations

import structlog
from troupe.gpu.runner import ReloadsWeights, Runner, Sleeper, SleepsRunner, WeightsRefused
from troupe.gpu.runner_dead import runner_dead
from troupe.gpu.sleep_state import SleepRefused
from troupe.messages.engine_calls import WeightsErrorCode
from troupe.messages.sleep_calls import ALL_TAGS, Sleep, SleepCall, SleepDone, SleepErrorCode

log = structlog.get_logger("troupe.executor")


def sleeper_of(runner: Runner) -> Sleeper | None:
    """The runner's Sleeper; None: it has no sleep mode (tensor parallelism, a wrapped runner)."""
    return runner.sleeper if isinstance(runner, SleepsRunner) else None


def run_sleep_call(sleeper: Sleeper | None, msg: SleepCall) -> SleepDone:
    """Apply a Sleep or WakeUp to the runner (none live: the scheduler sends it so)."""
    if sleeper is None:
        message = "this runner has no sleep mode (tensor parallelism, disaggregation, a wrapper)"
        return SleepDone(
            call_id=msg.call_id, message=message, sleeping=(), error=SleepErrorCode.UNSUPPORTED
        )
    sleeping = sleeper.sleeping
    try:
        if isinstance(msg, Sleep):
            if sleeping:
                message = f"already asleep (level {sleeper.level}): nothing changed"
                return _done(sleeper, msg.call_id, message)
            try:
                message = sleeper.sleep(msg.level)
            except SleepRefused as exc:  # nothing was freed
                message = f"sleep(level={msg.level}) refused: {exc}"
                return _done(sleeper, msg.call_id, message, SleepErrorCode.UNSUPPORTED)
            log.info("asleep", level=msg.level, summary=message)
            return _done(sleeper, msg.call_id, message, kv_dropped=True)
        tags = tuple(t for t in ALL_TAGS if t in (msg.tags or ALL_TAGS) and t in sleeping)
        if not tags:
            return _done(sleeper, msg.call_id, "nothing of that sleeps: nothing changed")
        message = sleeper.wake_up(tags)
        log.info("woke up", tags=[str(t) for t in tags], summary=message)
        return _done(sleeper, msg.call_id, message)
    except Exception as exc:
        if (dead := runner_dead(exc)) is not None:  # the engine turns dead (engine_death.py)
            if dead is exc:
                raise
            raise dead from exc
        log.exception("sleep call failed", call=type(msg).__name__)
        message = f"{type(msg).__name__} failed: {type(exc).__name__}: {exc}"
        # a sleep that failed midway may have dropped the KV: the prefix cache goes too
        return _done(sleeper, msg.call_id, message, SleepErrorCode.FAILED, kv_dropped=True)


def from_staged(runner: Runner, call_id: int) -> str:
    """Copy the tensors the engine staged for update `call_id` into the runner's weights."""
    if not isinstance(runner, ReloadsWeights):
        raise WeightsRefused(
            "this runner cannot replace its weights (the fake runner, a wrapped one)",
            WeightsErrorCode.UNSUPPORTED,
        )
    return runner.weights.from_staged(call_id)


def _done(
    sleeper: Sleeper,
    call_id: int,
    message: str,
    error: SleepErrorCode | None = None,
    *,
    kv_dropped: bool = False,
) -> SleepDone:
    return SleepDone(
        call_id=call_id,
        message=message,
        sleeping=sleeper.sleeping,
        level=sleeper.level,
        error=error,
        kv_dropped=kv_dropped,
    )
