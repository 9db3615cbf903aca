"""Sleep mode (vLLM's --enable-sleep-mode): the engine gives its device memory back between
rollouts and takes it again, for RL trainers that share the GPU (messages/engine_calls.py's
calls, same path).

    sleep(level)     Sleep ──► scheduler: refused (naming them) while requests are live, unless
                              mode "wait" (they end first) or "abort"; newer requests are held
                              ──► executor: level 1 weights to CPU memory, level 2 weights
                              dropped; the KV pools dropped (gpu/sleep_mode.py)
                     SleepDone ──► scheduler: DropCachedBlocks (the KV is gone)
                     SleepReply ◄── scheduler; held requests keep waiting
    wake_up(tags)    WakeUp ──► scheduler ──► executor: "weights" back (level 1: the values;
                              level 2: memory to load into), "kv_cache" re-allocated
                     SleepDone ──► scheduler; SleepReply; awake: the held requests start
"""

from __future__ import annotations

import enum
from typing import Literal

import msgspec
from troupe.messages.common import CacheDropped


class SleepTag(enum.StrEnum):
    """What a wake_up brings back (vLLM's tags)."""

    WEIGHTS = "weights"
    KV_CACHE = "kv_cache"


ALL_TAGS = (SleepTag.WEIGHTS, SleepTag.KV_CACHE)
SLEEP_LEVELS = (1, 2)  # 1: weights kept in CPU memory; 2: weights dropped (new ones follow)

# What a sleep does with live requests: "refuse" names them (vLLM's rule: the caller ends
# them first), "wait" lets them end (newer ones wait), "abort" aborts them first.
SleepMode = Literal["refuse", "wait", "abort"]
SLEEP_MODES: tuple[SleepMode, ...] = ("refuse", "wait", "abort")


class SleepErrorCode(enum.StrEnum):
    """Why a sleep or wake_up was refused (the gateway: 409 for BUSY and RUNNING, 503 for a
    stopped engine, else 400). A refusal changes nothing."""

    DISABLED = "sleep_mode_disabled"  # EngineConfig.enable_sleep_mode is off
    INVALID = "invalid_argument"  # a level or tag that does not exist
    UNSUPPORTED = "unsupported"  # a runner that cannot (tensor parallelism, disaggregation)
    BUSY = "call_in_progress"  # another sleep, wake_up or weight update has not ended
    RUNNING = "unfinished_requests"  # requests are live (mode "refuse")
    FAILED = "failed"  # the runner raised midway: its state is in the reply's tags


class Sleep(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """To the scheduler from the engine, then to the executor once no request is live."""

    call_id: int
    level: int
    mode: SleepMode = "refuse"


class WakeUp(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """To the scheduler from the engine, then to the executor. `tags` empty: all."""

    call_id: int
    tags: tuple[SleepTag, ...] = ()


class SleepDone(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """From the executor: the end of a Sleep or WakeUp, and what sleeps now."""

    call_id: int
    message: str
    sleeping: tuple[SleepTag, ...]  # what is asleep after the call
    level: int = 0  # the sleep's level while anything sleeps
    error: SleepErrorCode | None = None
    kv_dropped: bool = False  # the KV pools were dropped: the prefix cache goes too


class SleepReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """To the engine: the end of a Sleep or WakeUp `call_id` (or an answer to is_sleeping)."""

    call_id: int
    message: str
    sleeping: tuple[SleepTag, ...] = ()
    level: int = 0
    error: SleepErrorCode | None = None
    dropped: CacheDropped | None = None  # the prefix cache reset after a sleep
    num_paused_requests: int = 0  # requests waiting for the wake_up

    @property
    def success(self) -> bool:
        return self.error is None

    @property
    def is_sleeping(self) -> bool:
        """vLLM's: true until every tag is awake again."""
        return bool(self.sleeping)


SleepCall = Sleep | WakeUp  # what the scheduler passes on to the executor
