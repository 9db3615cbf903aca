"""RemoteAdmin: the engine's calls beside requests (actors/engine_admin.py) when the engine is
in the child process (gateway/remote_engine.py).

    reset_prefix_cache()           ──► ResetCache(call_id)            the child runs each in a
    update_weights_from_disk(...)  ──► UpdateWeightsFromDisk(call_id) task of its own
                                   ◄── EngineCallReply(call_id)       the engine's reply, or
                                                                      that it stopped first

A call raises what the in-process Engine raises (EngineStopped) and returns what it returns.
"""

from __future__ import annotations

from collections.abc import Callable

from troupe.actors.engine_stopped import EngineStopped
from troupe.gateway.pending_calls import PendingCalls
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
        self._calls: PendingCalls[EngineCallReply] = PendingCalls(send)

    async def reset_prefix_cache(self) -> PrefixCacheReset:
        reply = await self._call(lambda call_id: ResetCache(call_id=call_id))
        assert isinstance(reply, PrefixCacheReset), reply
        return reply

    async def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None, *, abort_all_requests: bool = False
    ) -> WeightsUpdated:
        reply = await self._call(
            lambda call_id: UpdateWeightsFromDisk(
                call_id=call_id,
                model_path=model_path,
                load_format=load_format,
                abort_all_requests=abort_all_requests,
            )
        )
        assert isinstance(reply, WeightsUpdated), reply
        return reply

    def on_reply(self, reply: EngineCallReply) -> None:
        self._calls.answer(reply.call_id, reply)

    def stop(self, why: str) -> None:
        """The engine is gone: the calls still waiting raise EngineStopped, as do later ones."""
        self._calls.stop(why)

    async def _call(
        self, make: Callable[[int], ResetCache | UpdateWeightsFromDisk]
    ) -> PrefixCacheReset | WeightsUpdated:
        answer = await self._calls.call(make)
        if answer.reply is None:
            raise EngineStopped(answer.stopped or "the engine stopped")
        return answer.reply
