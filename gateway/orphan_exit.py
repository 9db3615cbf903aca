"""The engine child's last resort: once its server is gone it must not live on, holding the GPU.

On its socket's end of file the child stops in order: it aborts what is left, waits for the
step in flight, closes the runner and exits. A runner stuck inside a step (a hung kernel, a
deadlock) makes that wait last forever, and so would the interpreter's own exit, which joins
worker threads. So the end of file also arms this timer, in a daemon thread of its own (it runs
whatever the event loop or the main thread wait for, and never delays an exit itself): if the
process still lives `EngineConfig.orphan_stop_timeout_s` later, it logs why and ends with
`os._exit(ORPHAN_EXIT_CODE)`, skipping every cleanup that could wait too.
"""

from __future__ import annotations

import os
import sys
import threading

import structlog

log = structlog.get_logger("troupe.engine_process")

# Distinct from 0 (a clean stop) and 1 (a failure): the server was gone and the stop hung.
ORPHAN_EXIT_CODE = 3


def arm_orphan_exit(timeout: float) -> threading.Timer:
    """End this process with ORPHAN_EXIT_CODE unless it has exited `timeout` s from now."""
    timer = threading.Timer(timeout, _exit_now, args=(timeout,))
    timer.name = "troupe-orphan-exit"
    timer.daemon = True
    timer.start()
    return timer


def _exit_now(timeout: float) -> None:
    log.error(
        "the server is gone and the engine did not stop within orphan_stop_timeout_s "
        "(a runner step that never returns?); exiting without cleanup",
        orphan_stop_timeout_s=timeout,
        exit_code=ORPHAN_EXIT_CODE,
    )
    for stream in (sys.stdout, sys.stderr):  # os._exit skips the flush at exit
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # closed or broken: nothing more to say there
    os._exit(ORPHAN_EXIT_CODE)
