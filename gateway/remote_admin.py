"""RemoteAdmin: the engine's calls beside requests (actors/engine_admin.py) when the engine is
in the child process (gateway/remote_engine.py).

    reset_prefix_cache()           ──► ResetCache(call_id)            the child runs each in a
    update_weights_from_disk(...)  ──► UpdateWeightsFromDisk(call_id) task of its own
    sleep(...) / wake_up(...)      ──► SleepEngine / WakeEngine(call_id)
    start_profile / stop_profile   ──► ProfileEngine(call_id)
                                   ◄── EngineCallReply(call_id)       the engine's reply, or
                                                                      that it stopped first

A call raises what the in-process Engine raises (EngineStopped) and returns what it returns.
is_sleeping() answers from the last sleep or wake_up reply: they all go through here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from troupe.actors.engine_stopped import EngineStopped
from troupe.gateway.pending_calls import PendingCalls
from troupe.messages.engine_calls import EngineCallsInbox, PrefixCacheReset, WeightsUpdated
from troupe.messages.engine_protocol import (
    EngineCallReply,
    ProfileEngine,
    ResetCache,
    SleepEngine,
    ToEngine,
    UpdateWeightsFromDisk,
    WakeEngine,
)
from troupe.messages.profile_calls import ProfileReply
from troupe.messages.sleep_calls import SleepErrorCode, SleepMode, SleepReply

_Call = ResetCache | UpdateWeightsFromDisk | SleepEngine | WakeEngine | ProfileEngine


class RemoteAdmin:
    """The gateway's handle on the child's EngineAdmin, over the engine protocol."""

    def __init__(self, send: Callable[[ToEngine], None]) -> None:
        self._calls: PendingCalls[EngineCallReply] = PendingCalls(send)
        self._is_sleeping = False  # as the last sleep or wake_up that changed it said

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

    async def start_profile(
        self, *, record_shapes: bool = False, with_stack: bool = False
    ) -> ProfileReply:
        return await self._profile(
            lambda call_id: ProfileEngine(
                call_id=call_id, start=True, record_shapes=record_shapes, with_stack=with_stack
            )
        )

    async def stop_profile(self) -> ProfileReply:
        return await self._profile(lambda call_id: ProfileEngine(call_id=call_id, start=False))

    async def _profile(self, make: Callable[[int], _Call]) -> ProfileReply:
        reply = await self._call(make)
        assert isinstance(reply, ProfileReply), reply
        return reply

    async def sleep(self, level: int = 1, *, mode: SleepMode = "refuse") -> SleepReply:
        reply = await self._call(
            lambda call_id: SleepEngine(call_id=call_id, level=level, mode=mode)
        )
        return self._slept(reply)

    async def wake_up(self, tags: Sequence[str] | None = None) -> SleepReply:
        given = (tags,) if isinstance(tags, str) else tuple(tags or ())
        reply = await self._call(lambda call_id: WakeEngine(call_id=call_id, tags=given))
        return self._slept(reply)

    async def is_sleeping(self) -> bool:
        return self._is_sleeping

    def _slept(self, reply: object) -> SleepReply:
        assert isinstance(reply, SleepReply), reply
        if reply.error is None or reply.error == SleepErrorCode.FAILED:
            self._is_sleeping = reply.is_sleeping
        return reply

    def on_reply(self, reply: EngineCallReply) -> None:
        self._calls.answer(reply.call_id, reply)

    def stop(self, why: str) -> None:
        """The engine is gone: the calls still waiting raise EngineStopped, as do later ones."""
        self._calls.stop(why)

    async def _call(self, make: Callable[[int], _Call]) -> EngineCallsInbox:
        answer = await self._calls.call(make)
        if answer.reply is None:
            raise EngineStopped(answer.stopped or "the engine stopped")
        return answer.reply
