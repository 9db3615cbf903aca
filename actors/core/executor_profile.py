"""The executor's torch profiler (messages/profile_calls.py): started and stopped between two
steps, in the executor's own thread, so it records what the runner does there: the CPU ops,
and the CUDA kernels where there is a GPU. A stop writes a Chrome trace (chrome://tracing,
Perfetto, TensorBoard's profiler plugin read it) into EngineConfig.profiler_dir, named by the
time it started, the process and the call: `troupe-<UTC time>-<pid>-<call>.pt.trace.json`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import structlog
from troupe.messages.profile_calls import (
    ProfileErrorCode,
    ProfileReply,
    StartProfile,
    StopProfile,
)

log = structlog.get_logger("troupe.executor")


class StepProfiler:
    """One profile at a time, into `folder` (None: profiling is off)."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        self._profile: Any = None  # the running torch.profiler.profile
        self._started = 0.0  # its time.time()

    @property
    def is_running(self) -> bool:
        return self._profile is not None

    def handle(self, msg: StartProfile | StopProfile) -> ProfileReply:
        if self.folder is None:
            return _refused(
                msg,
                ProfileErrorCode.OFF,
                "profiling is off: start the engine with profiler_dir (troupe serve --profiler-dir DIR)",
            )
        if isinstance(msg, StartProfile):
            return self._start(msg)
        return self._stop(msg)

    def _start(self, msg: StartProfile) -> ProfileReply:
        if self._profile is not None:
            return _refused(msg, ProfileErrorCode.RUNNING, "a profile is running: stop it first")
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profile = torch.profiler.profile(
            activities=activities,
            record_shapes=msg.record_shapes,
            with_stack=msg.with_stack,
            acc_events=True,  # one cycle a profile: nothing to clear (and no warning)
        )
        try:
            profile.start()
        except Exception as exc:
            log.exception("the profiler did not start")
            return _refused(msg, ProfileErrorCode.FAILED, f"the profiler did not start: {exc}")
        self._profile, self._started = profile, time.time()
        kinds = " and ".join(a.name for a in activities)
        log.info("profiling", activities=kinds, folder=self.folder)
        return ProfileReply(call_id=msg.call_id, message=f"profiling {kinds} activity")

    def _stop(self, msg: StopProfile) -> ProfileReply:
        profile, self._profile = self._profile, None
        if profile is None:
            return _refused(msg, ProfileErrorCode.NOT_RUNNING, "no profile is running")
        assert self.folder is not None
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self._started))
        path = Path(self.folder) / f"troupe-{stamp}-{os.getpid()}-{msg.call_id}.pt.trace.json"
        try:
            profile.stop()
            path.parent.mkdir(parents=True, exist_ok=True)
            profile.export_chrome_trace(str(path))
        except Exception as exc:
            log.exception("the profile was not written", path=str(path))
            return _refused(msg, ProfileErrorCode.FAILED, f"the profile was not written: {exc}")
        seconds = time.time() - self._started
        log.info("profile written", path=str(path), seconds=round(seconds, 3))
        return ProfileReply(
            call_id=msg.call_id,
            message=f"a profile of {seconds:.1f} s written to {path}",
            trace_path=str(path),
        )


def _refused(msg: StartProfile | StopProfile, code: ProfileErrorCode, message: str) -> ProfileReply:
    return ProfileReply(call_id=msg.call_id, message=message, error=code)
