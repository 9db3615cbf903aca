"""The engine's calls into its graph beside requests: drop the prefix cache, load new weights.

The Engine (actors/engine_admin.py) writes them straight into the scheduler's inbox; the
scheduler answers on a channel of their own ("engine": EngineCallsInbox) that the engine reads.

    reset_prefix_cache()        ResetPrefixCache ──► scheduler: DropCachedBlocks, the last op of
                                                     its next AllocateBatch ──► allocator
                                PrefixCacheReset ◄── scheduler (AllocationResult.cache_dropped)
    update_weights_from_disk()  UpdateWeights ──► scheduler: the requests it took run to their
                                                  end, newer ones wait; then ──► executor
                                                  WeightsLoaded ──► scheduler: DropCachedBlocks
                                WeightsUpdated ◄── scheduler; the waiting requests start
"""

from __future__ import annotations

import enum

import msgspec
from troupe.messages.common import CacheDropped as CacheDropped  # its home: common.py
from troupe.messages.profile_calls import ProfileReply
from troupe.messages.sleep_calls import SleepReply


class ResetPrefixCache(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Drop every cached prefix block no request holds, in both tiers (GPU, CPU)."""

    call_id: int


class UpdateWeights(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Copy the weights of the checkpoint in folder `model_path` (the served model's
    architecture, shapes and dtype) into the model's own tensors, then reset the prefix cache.
    To the scheduler from the engine, then to the executor once no request it took runs.
    `from_tensors`: the tensors the engine staged in the runner under this call id instead
    (Engine.update_weights_from_tensors; gpu/weight_update.WeightReload.stage)."""

    call_id: int
    model_path: str
    from_tensors: bool = False


class PrefixCacheReset(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """To the engine: the ResetPrefixCache calls `call_ids` are done; what was dropped."""

    call_ids: tuple[int, ...]
    dropped: CacheDropped


class WeightsErrorCode(enum.StrEnum):
    """Why an update was refused (the gateway answers 409 for BUSY, 503 for STOPPED, else 400)."""

    INVALID = "invalid_checkpoint"  # unreadable, or not the served model's shapes and dtype
    UNSUPPORTED = "unsupported"  # quantized weights, tensor parallelism, disaggregation, ...
    BUSY = "update_in_progress"  # another update has not ended
    FAILED = "load_failed"  # a read failed after copying began: weights may be mixed


class WeightsLoaded(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """From the executor: the end of an UpdateWeights, `message` saying what was copied or
    why nothing was (`error` set)."""

    call_id: int
    message: str
    error: WeightsErrorCode | None = None

    @property
    def is_changed(self) -> bool:
        """Whether the weights may have changed: the prefix cache is reset then."""
        return self.error is None or self.error == WeightsErrorCode.FAILED


class WeightsUpdated(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """To the engine: the end of UpdateWeights `call_id` (SGLang's success and message)."""

    call_id: int
    message: str
    error: WeightsErrorCode | None = None
    dropped: CacheDropped | None = None  # the prefix cache reset after the copy
    num_paused_requests: int = 0  # requests that waited for the update to start

    @property
    def success(self) -> bool:
        return self.error is None


# sleep: sleep_calls.py; the profiler: profile_calls.py
EngineCallsInbox = PrefixCacheReset | WeightsUpdated | SleepReply | ProfileReply
