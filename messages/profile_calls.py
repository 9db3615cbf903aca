"""The torch profiler around the executor's steps (vLLM's and SGLang's /start_profile and
/stop_profile; EngineConfig.profiler_dir), on the engine calls' path (messages/engine_calls.py):

    start_profile()   StartProfile ──► scheduler ──► executor: the profiler starts in the
                                                    executor's thread, between two steps
                      ProfileReply ◄── scheduler ◄── executor
    stop_profile()    StopProfile  ──► scheduler ──► executor: it stops and writes its trace
                      ProfileReply (trace_path) ◄── scheduler ◄── executor

Requests run on meanwhile: a profile records the steps they make.
"""

from __future__ import annotations

import enum

import msgspec


class ProfileErrorCode(enum.StrEnum):
    """Why a profile call changed nothing (the gateway: 404 for OFF and UNSUPPORTED, 409 for
    the two states, 500 for FAILED)."""

    OFF = "profiling_off"  # EngineConfig.profiler_dir is None
    UNSUPPORTED = "unsupported"  # disaggregation: two executors
    RUNNING = "profile_running"  # a start while a profile runs
    NOT_RUNNING = "no_profile_running"  # a stop with none running
    FAILED = "profile_failed"  # the profiler raised (the message says what)


class StartProfile(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Start recording: CPU ops always, CUDA kernels where the runner has a GPU."""

    call_id: int
    record_shapes: bool = False
    with_stack: bool = False


class StopProfile(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Stop recording and write the trace (Chrome trace JSON) into the profiler folder."""

    call_id: int


class ProfileReply(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """To the engine: how a StartProfile or StopProfile went; `trace_path` a stop's file."""

    call_id: int
    message: str
    error: ProfileErrorCode | None = None
    trace_path: str | None = None
