"""RemoteAdmin: the engine's calls beside requests (actors/engine_admin.py) when the engine is
in the child process (gateway/remote_engine.py).

    reset_prefix_cache()           ──► ResetCache(call_id)            the child runs each in a
    update_weights_from_disk(...)  ──► UpdateWeightsFromDisk(call_id) task of its own
                                   ◄── EngineCallReply(call_id)       the engine's reply, or
                                                                      that it stopped first

A call raises what the in-process Engine raises (EngineStopped) and returns what it returns.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from troupe.actors.engine_stopped import EngineStopped
from troupe.messages.engine_calls import PrefixCacheReset, WeightsUpdated
from troupe.messages.engine_protocol import (
    EngineCallReply,
    ResetCache,
    ToEngine,
    UpdateWeightsFromDisk,
)


class RemoteAdmin:
    """The gateway's handle on the child's EngineAdmin, over the engine protocol."""

    def __init__(self, send: Callable[[ToEngine], None]) -> None:
        self._send = send
        self._calls: dict[int, asyncio.Future[EngineCallReply]] = {}  # call_id -> its waiter
        self._call_ids = itertools.count(1)
        self._stopped: str | None = None  # why no call can be answered any more

    async def reset_prefix_cache(self) -> PrefixCacheReset:
        call_id = next(self._call_ids)
        reply = await self._call(call_id, ResetCache(call_id=call_id))
        assert isinstance(reply, PrefixCacheReset), reply
        return reply

    async def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None, *, abort_all_requests: bool = False
    ) -> WeightsUpdated:
        call_id = next(self._call_ids)
        command = UpdateWeightsFromDisk(
            call_id=call_id,
            model_path=model_path,
            load_format=load_format,
            abort_all_requests=abort_all_requests,
        )
        reply = await self._call(call_id, command)
        assert isinstance(reply, WeightsUpdated), reply
        return reply

    def on_reply(self, reply: EngineCallReply) -> None:
        waiter = self._calls.pop(reply.call_id, None)
        if waiter is not None and not waiter.done():  # its caller may have gone away
            waiter.set_result(reply)

    def stop(self, why: str) -> None:
        """The engine is gone: the calls still waiting raise EngineStopped, as do later ones."""
        self._stopped = why
        for waiter in self._calls.values():
            if not waiter.done():
                waiter.set_exception(EngineStopped(why))
        self._calls.clear()

    async def _call(
        self, call_id: int, command: ResetCache | UpdateWeightsFromDisk
    ) -> PrefixCacheReset | WeightsUpdated:
        if self._stopped is not None:
            raise EngineStopped(self._stopped)
        waiter: asyncio.Future[EngineCallReply] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = waiter
        try:
            self._send(command)
            answer = await waiter
        finally:
            self._calls.pop(call_id, None)
        if answer.reply is None:
            raise EngineStopped(answer.stopped or "the engine stopped")
        return answer.reply
