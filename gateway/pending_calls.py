"""PendingCalls: the engine child's calls that await a reply by call id (gateway/remote_admin.py,
gateway/remote_loras.py).

    call(make)       ──► make(call_id)        sent over the engine's socket
    answer(id, r)    ◄── the reply, by id     resolves that call's waiter
    stop(why)                                 waiting and later calls raise EngineStopped
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Generic, TypeVar

from troupe.actors.engine_stopped import EngineStopped
from troupe.messages.engine_protocol import ToEngine

R = TypeVar("R")


class PendingCalls(Generic[R]):
    """Waiters of calls sent to the engine child, by call id; replies are of type R."""

    def __init__(self, send: Callable[[ToEngine], None]) -> None:
        self._send = send
        self._waiters: dict[int, asyncio.Future[R]] = {}  # call_id -> its waiter
        self._call_ids = itertools.count(1)
        self._stopped: str | None = None  # why no call can be answered any more

    async def call(self, make: Callable[[int], ToEngine]) -> R:
        """Send `make(call_id)` with a fresh id and wait for that id's reply."""
        if self._stopped is not None:
            raise EngineStopped(self._stopped)
        call_id = next(self._call_ids)
        waiter: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiters[call_id] = waiter
        try:
            self._send(make(call_id))
            return await waiter
        finally:
            self._waiters.pop(call_id, None)

    def answer(self, call_id: int, reply: R) -> None:
        waiter = self._waiters.pop(call_id, None)
        if waiter is not None and not waiter.done():  # its caller may have gone away
            waiter.set_result(reply)

    def stop(self, why: str) -> None:
        """The engine is gone: the calls still waiting raise EngineStopped, as do later ones."""
        self._stopped = why
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(EngineStopped(why))
        self._waiters.clear()
