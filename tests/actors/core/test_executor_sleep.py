"""The executor's sleep calls (actors/core/executor_sleep.py) over a stub Sleeper: a sleep the
runner refuses before freeing anything answers UNSUPPORTED with its reason and keeps the KV (the
prefix cache stays); one that fails midway answers FAILED and drops the KV."""

from __future__ import annotations

from troupe.actors.core.executor_sleep import run_sleep_call
from troupe.gpu.sleep_state import SleepRefused, SleepState
from troupe.messages.sleep_calls import Sleep, SleepErrorCode, SleepTag


class _Stub:
    """A Sleeper whose sleep raises `error` (None: sleeps)."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.state = SleepState()

    @property
    def sleeping(self) -> tuple[SleepTag, ...]:
        return self.state.sleeping

    @property
    def level(self) -> int:
        return self.state.level

    def sleep(self, level: int) -> str:
        if self.error is not None:
            raise self.error
        self.state.fall_asleep(level)
        return "asleep"

    def wake_up(self, tags: tuple[SleepTag, ...]) -> str:
        self.state.wake(tags)
        return "awake"


def test_a_refused_sleep_answers_unsupported_and_keeps_the_kv() -> None:
    stub = _Stub(SleepRefused("3 served weights are kept quantized (embed_tokens, ...)"))
    done = run_sleep_call(stub, Sleep(call_id=7, level=2))
    assert done.error == SleepErrorCode.UNSUPPORTED and not done.kv_dropped
    assert done.message.startswith("sleep(level=2) refused: 3 served weights")
    assert done.sleeping == () and done.level == 0 and done.call_id == 7


def test_a_sleep_failing_midway_answers_failed_and_drops_the_kv() -> None:
    done = run_sleep_call(_Stub(RuntimeError("out of host memory")), Sleep(call_id=8, level=1))
    assert done.error == SleepErrorCode.FAILED and done.kv_dropped
    assert "RuntimeError: out of host memory" in done.message
    done = run_sleep_call(_Stub(None), Sleep(call_id=9, level=1))
    assert (
        done.error is None
        and done.kv_dropped
        and done.sleeping
        == (
            SleepTag.WEIGHTS,
            SleepTag.KV_CACHE,
        )
    )
