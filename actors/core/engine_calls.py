"""The engine's calls the scheduler serves beside requests (messages/engine_calls.py).

A prefix-cache reset rides the next AllocateBatch as its last op, DropCachedBlocks: the
batch's frees are dropped too, blocks running requests hold keep their entries.

A weight update never meets a running step or a request that runs on two sets of weights:

    UpdateWeights arrives     draining: the requests the scheduler took run to their end
                              (SGLang waits for them too); requests arriving now are held
                              aside, not queued
    none left, no step out    loading: UpdateWeights to the executor, no plan meanwhile
    WeightsLoaded             dropping: the next batch frees what ended and drops the cache
                              (unless nothing was copied), so no KV of the old weights serves
    its AllocationResult      WeightsUpdated to the engine; the held requests are queued

An abort reaches a held request too (it ends Aborted, never having run).

Sleep and wake_up (messages/sleep_calls.py) take the same path, one executor call at a time:
a sleep is refused naming the live requests (mode "refuse"), or drains them ("wait", "abort":
the engine aborted them first); its SleepDone drops the cache as a weight update's does. While
anything sleeps, arriving requests are held as during an update, and run once all is awake.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

import msgspec
from troupe.messages.engine_calls import (
    CacheDropped,
    PrefixCacheReset,
    ResetPrefixCache,
    UpdateWeights,
    WeightsErrorCode,
    WeightsLoaded,
    WeightsUpdated,
)
from troupe.messages.scheduler import AdmittedRequest
from troupe.messages.sleep_calls import (
    Sleep,
    SleepDone,
    SleepErrorCode,
    SleepReply,
    SleepTag,
    WakeUp,
)

Stage = Literal["draining", "loading", "dropping"]
Reply = PrefixCacheReset | WeightsUpdated | SleepReply
ExecutorCall = UpdateWeights | Sleep | WakeUp  # one at a time, with no step out
_NAMED = 5  # live requests a refused sleep names


class EngineCalls:
    """Prefix-cache resets and weight updates in progress, and the requests held meanwhile."""

    def __init__(self) -> None:
        self.resets: list[int] = []  # ResetPrefixCache call ids not yet sent to the allocator
        self._sent: list[int] = []  # ... sent with the AllocateBatch in flight
        self.update: ExecutorCall | None = None
        self.stage: Stage | None = None
        self._loaded: WeightsLoaded | SleepDone | None = None
        self.held: dict[str, AdmittedRequest] = {}  # arrived during an update or sleep, by id
        self.sleeping: tuple[SleepTag, ...] = ()  # as the executor's last SleepDone said
        self.sleep_level = 0

    def reset(self, msg: ResetPrefixCache) -> None:
        self.resets.append(msg.call_id)

    def begin(self, msg: ExecutorCall, live: Collection[str] = ()) -> Reply | None:
        """Start a call; the refusal when another is under way (the engine runs one at once),
        or for a Sleep of mode "refuse" while requests (`live`: their ids) are live."""
        if self.update is not None:
            message = f"{_name(self.update)} {self.update.call_id} has not ended"
            if isinstance(msg, UpdateWeights):
                return WeightsUpdated(
                    call_id=msg.call_id, message=message, error=WeightsErrorCode.BUSY
                )
            return self._sleep_reply(msg.call_id, message, SleepErrorCode.BUSY)
        if isinstance(msg, Sleep) and msg.mode == "refuse" and live:
            ids = sorted(live)
            more = f" and {len(ids) - _NAMED} more" if len(ids) > _NAMED else ""
            message = (
                f"cannot sleep with {len(ids)} unfinished requests: "
                f"{', '.join(map(repr, ids[:_NAMED]))}{more}; abort them first (or sleep with "
                "mode 'abort' or 'wait')"
            )
            return self._sleep_reply(msg.call_id, message, SleepErrorCode.RUNNING)
        self.update, self.stage = msg, "draining"
        return None

    def hold(self, msg: AdmittedRequest) -> bool:
        """Keep a new request aside while a call is under way or anything sleeps; False:
        neither."""
        if self.update is None and not self.sleeping:
            return False
        self.held[msg.request_id] = msg
        return True

    def to_load(self, num_live: int) -> ExecutorCall | None:
        """The update to send to the executor now (no request left, the scheduler idle)."""
        if self.stage != "draining" or num_live:
            return None
        self.stage = "loading"
        return self.update

    def loaded(self, msg: WeightsLoaded | SleepDone) -> Reply | None:
        """The executor's answer; the reply at once when nothing changed (no cache to drop)."""
        assert self.update is not None and self.stage == "loading", "an update was sent"
        self._loaded = msg
        self.stage = "dropping"
        if isinstance(msg, SleepDone):
            self.sleeping, self.sleep_level = msg.sleeping, msg.level
            if msg.kv_dropped:
                return None
        elif msg.is_changed:
            return None
        return self._finish(None)

    def take_drop(self) -> bool:
        """Whether the batch being planned ends with DropCachedBlocks."""
        self._sent, self.resets = self.resets, []
        return bool(self._sent) or self.stage == "dropping"

    def dropped(self, dropped: CacheDropped | None) -> list[Reply]:
        """The replies an AllocationResult completes (`cache_dropped`: its DropCachedBlocks)."""
        if dropped is None:
            return []
        replies: list[Reply] = []
        if self._sent:
            replies.append(PrefixCacheReset(call_ids=tuple(self._sent), dropped=dropped))
            self._sent = []
        if self.stage == "dropping":
            replies.append(self._finish(dropped))
        return replies

    def release(self) -> list[AdmittedRequest]:
        """The held requests, once no call is under way and all is awake (then queued as they
        came)."""
        if self.update is not None or self.sleeping or not self.held:
            return []
        held, self.held = list(self.held.values()), {}
        return held

    def _sleep_reply(self, call_id: int, message: str, error: SleepErrorCode | None) -> SleepReply:
        return SleepReply(
            call_id=call_id,
            message=message,
            sleeping=self.sleeping,
            level=self.sleep_level,
            error=error,
            num_paused_requests=len(self.held),
        )

    def _finish(self, dropped: CacheDropped | None) -> Reply:
        loaded, update = self._loaded, self.update
        assert loaded is not None and update is not None
        self.update = self.stage = self._loaded = None
        if isinstance(loaded, SleepDone):
            reply = self._sleep_reply(loaded.call_id, loaded.message, loaded.error)
            return msgspec.structs.replace(reply, dropped=dropped)
        return WeightsUpdated(
            call_id=update.call_id,
            message=loaded.message,
            error=loaded.error,
            dropped=dropped,
            num_paused_requests=len(self.held),
        )


def _name(call: ExecutorCall) -> str:
    return {UpdateWeights: "weight update", Sleep: "sleep", WakeUp: "wake_up"}[type(call)]
