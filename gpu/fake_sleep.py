"""Sleep mode for the fake runner (EngineConfig.runner "fake" with enable_sleep_mode): the
engine's sleep path without a model, for tests and benchmarks of the graph.

A sleep drops the fake model's KV contents (both pools' stores, fresh and unwritten), as the
real runner drops its pools: a step that read a block from before the sleep (a prefix-cache hit
the allocator should have forgotten) raises the fake runner's "KV cache corruption". Its
"weights" are arithmetic, so waking them brings the same model back at either level.
"""

from __future__ import annotations

from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.runner_wrapper import RunnerWrapper
from troupe.gpu.sleep_state import SleepState
from troupe.messages.sleep_calls import SleepTag


class FakeSleeper:
    """The fake runner's gpu.runner.Sleeper."""

    def __init__(self, runner: FakeRunner) -> None:
        self._runner = runner
        self._state = SleepState()
        self.num_sleeps = 0

    @property
    def sleeping(self) -> tuple[SleepTag, ...]:
        return self._state.sleeping

    @property
    def level(self) -> int:
        return self._state.level

    def sleep(self, level: int) -> str:
        runner = self._runner
        for store in (runner.gpu, runner.cpu):  # the contents go; nothing reads them until
            type(store).__init__(store, len(store.sum), runner.block_size)  # written again
        self._state.fall_asleep(level)
        self.num_sleeps += 1
        return f"fake runner asleep (level {level}): KV contents dropped"

    def wake_up(self, tags: tuple[SleepTag, ...]) -> str:
        self._state.wake(tags)
        return f"fake runner woke {', '.join(tags)}"


class SleepyFakeRunner(RunnerWrapper):
    """A FakeRunner with a sleeper (gpu.runner.SleepsRunner)."""

    def __init__(self, inner: FakeRunner) -> None:
        super().__init__(inner)
        self.sleeper = FakeSleeper(inner)
