"""A FaultyRunner inside the engine child process, held and released from the test process.

`ChildRunnerGate(hang_at_step=n).factory` is a picklable runner factory for `serve(...,
runner_factory=...)`: in the child it builds a fake runner whose step `n` waits at the gate;
the test learns that a step is held through one cross-process event and releases it through
a pipe, so a stream is certain to be open (or to outlive a drain grace) however fast anything
runs. The release is a pipe, not a second Event: a child that dies while it waits on an Event
(killed, or its own hard exit) leaves a sleeper that Event.set waits for for ever, while a
write to a pipe whose reader is gone just lands in its buffer.
"""

from __future__ import annotations

import functools
import multiprocessing
import threading
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event

from troupe.config import EngineConfig
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner


class ChildRunnerGate:
    def __init__(self, *, hang_at_step: int) -> None:
        context = multiprocessing.get_context("spawn")  # the engine process's own context
        self.held = context.Event()
        released, self._release = context.Pipe(duplex=False)
        self.factory = functools.partial(
            held_fake_runner, hang_at_step=hang_at_step, held=self.held, released=released
        )

    def wait_until_held(self, timeout: float) -> bool:
        return self.held.wait(timeout)

    def release(self) -> None:
        """Let the held step go on (again: harmless; the child gone: lands in the buffer)."""
        self._release.send_bytes(b"go")


def held_fake_runner(
    config: EngineConfig, *, hang_at_step: int, held: Event, released: Connection
) -> FaultyRunner:
    """Runs in the engine child: the fake runner, gated at `hang_at_step`."""
    runner = FaultyRunner(FakeRunner.from_config(config), hang_at_step=hang_at_step)

    def tell_held() -> None:
        if runner.wait_until_held():
            held.set()

    def wait_release() -> None:
        try:
            released.recv_bytes()
        except EOFError:
            return  # the test process is gone: nothing will be released
        runner.release()

    for target in (tell_held, wait_release):
        threading.Thread(target=target, daemon=True).start()
    return runner


def dying_fake_runner(config: EngineConfig, *, dead_at_step: int) -> FaultyRunner:
    """Runs in the engine child: the fake runner, dead from step `dead_at_step` on."""
    return FaultyRunner(FakeRunner.from_config(config), dead_at_step=dead_at_step)
