"""The executor watchdog: a step that never returns stops the engine instead of hanging it.

A hung GPU step (a deadlocked kernel, a driver fault) cannot be interrupted from Python. The
watchdog notices that the executor has been inside one step for longer than `step_timeout_s`
and raises ExecutorHung in the engine's task group: every open request then gets a Failed event,
`Engine.is_healthy` turns False (so /health answers 503 and `troupe serve` exits non-zero for a
supervisor to restart it), and the hung worker thread is abandoned rather than awaited.
"""

from __future__ import annotations

import time

import anyio
from troupe.actors.shell import Actor


class ExecutorHung(RuntimeError):
    """The executor spent longer than step_timeout_s on one step."""


async def watch_executor(actor: Actor, timeout: float) -> None:
    """Raise ExecutorHung once `actor` has been inside one handle() for over `timeout` s."""
    # Polling a few times per timeout bounds the detection delay to timeout * 1.25.
    period = timeout / 4
    while True:
        await anyio.sleep(period)
        since = actor.busy_since
        if since is not None and time.monotonic() - since > timeout:
            actor.is_hung = True
            raise ExecutorHung(
                f"the executor has been running one step for over {timeout:g} s "
                "(step_timeout_s); the engine is stopping"
            )
