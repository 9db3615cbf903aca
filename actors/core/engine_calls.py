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
"""

from __future__ import annotations

from typing import Literal

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

Stage = Literal["draining", "loading", "dropping"]
Reply = PrefixCacheReset | WeightsUpdated


class EngineCalls:
    """Prefix-cache resets and weight updates in progress, and the requests held meanwhile."""

    def __init__(self) -> None:
        self.resets: list[int] = []  # ResetPrefixCache call ids not yet sent to the allocator
        self._sent: list[int] = []  # ... sent with the AllocateBatch in flight
        self.update: UpdateWeights | None = None
        self.stage: Stage | None = None
        self._loaded: WeightsLoaded | None = None
        self.held: dict[str, AdmittedRequest] = {}  # arrived during an update, by id

    def reset(self, msg: ResetPrefixCache) -> None:
        self.resets.append(msg.call_id)

    def begin(self, msg: UpdateWeights) -> WeightsUpdated | None:
        """Start an update; the refusal when one is under way (the engine runs one at once)."""
        if self.update is not None:
            message = f"weight update {self.update.call_id} has not ended"
            return WeightsUpdated(call_id=msg.call_id, message=message, error=WeightsErrorCode.BUSY)
        self.update, self.stage = msg, "draining"
        return None

    def hold(self, msg: AdmittedRequest) -> bool:
        """Keep a new request aside while an update is under way; False: none is."""
        if self.update is None:
            return False
        self.held[msg.request_id] = msg
        return True

    def to_load(self, num_live: int) -> UpdateWeights | None:
        """The update to send to the executor now (no request left, the scheduler idle)."""
        if self.stage != "draining" or num_live:
            return None
        self.stage = "loading"
        return self.update

    def loaded(self, msg: WeightsLoaded) -> Reply | None:
        """The executor's answer; the reply at once when nothing changed (no cache to drop)."""
        assert self.update is not None and self.stage == "loading", "an update was sent"
        self._loaded = msg
        self.stage = "dropping"
        if msg.is_changed:
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
        """The held requests, once no update is under way (then queued as they came)."""
        if self.update is not None or not self.held:
            return []
        held, self.held = list(self.held.values()), {}
        return held

    def _finish(self, dropped: CacheDropped | None) -> WeightsUpdated:
        loaded, update = self._loaded, self.update
        assert loaded is not None and update is not None
        self.update = self.stage = self._loaded = None
        return WeightsUpdated(
            call_id=update.call_id,
            message=loaded.message,
            error=loaded.error,
            dropped=dropped,
            num_paused_requests=len(self.held),
        )
