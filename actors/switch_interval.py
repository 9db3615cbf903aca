"""The interpreter's thread switch interval while engines run (EngineConfig.gil_switch_interval_s).

The actors share one interpreter: the event loop runs the scheduler, streamer and admission in
Python, while the executor and the grammar actor work in threads that give up the interpreter
lock around GPU syncs and xgrammar's mask fills. Coming back, such a thread waits until the
loop's thread drops the lock, which CPython forces only every switch interval (5 ms by
default): one GPU sync or mask fill per step could cost up to 5 ms of the step. Measured with
256 xgrammar matchers beside a busy Python thread: a batch mask fill 0.6 ms alone, 12-33 ms
contended at 5 ms, ~1-3 ms at 1 ms and below.

The first engine to open sets the interval; the last to close restores what it found. None
leaves the interpreter's setting alone.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_found = 0.0  # the interval before the first holder set its own


@contextmanager
def switch_interval(seconds: float | None) -> Iterator[None]:
    """Hold the interpreter's switch interval at `seconds` (None: do nothing)."""
    global _holders, _found
    if seconds is None:
        yield
        return
    with _lock:
        if _holders == 0:
            _found = sys.getswitchinterval()
        _holders += 1
        sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                sys.setswitchinterval(_found)
