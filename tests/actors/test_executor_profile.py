"""The executor's torch profiler (actors/core/executor_profile.py) through ExecutorCore.handle,
as the scheduler hands it the calls: off without a folder; one profile at a time; a stop
without a start refused; the trace written into the folder holds the ops run in the
executor's thread between the start and the stop, and none from before."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from troupe.actors.core.executor import ExecutorCore
from troupe.config import EngineConfig
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages.profile_calls import (
    ProfileErrorCode,
    ProfileReply,
    StartProfile,
    StopProfile,
)

CONFIG = EngineConfig(runner="fake", device="cpu", num_kv_blocks=64, gc_freeze=False)


def _call(core: ExecutorCore, msg: StartProfile | StopProfile) -> ProfileReply:
    ((to, reply),) = core.handle([msg])
    assert to == "scheduler" and isinstance(reply, ProfileReply)
    assert reply.call_id == msg.call_id
    return reply


def test_off_without_a_folder() -> None:
    core = ExecutorCore(FakeRunner.from_config(CONFIG))
    reply = _call(core, StartProfile(call_id=1))
    assert reply.error == ProfileErrorCode.OFF and "--profiler-dir" in reply.message
    assert _call(core, StopProfile(call_id=2)).error == ProfileErrorCode.OFF


def test_a_profile_records_the_ops_between_start_and_stop(tmp_path: Path) -> None:
    folder = tmp_path / "traces"  # made on the first stop
    core = ExecutorCore(FakeRunner.from_config(CONFIG), profiler_dir=str(folder))
    x = torch.ones(8, 8)
    torch.cumsum(x, 0)  # before the start: not in the trace
    assert _call(core, StopProfile(call_id=1)).error == ProfileErrorCode.NOT_RUNNING
    started = _call(core, StartProfile(call_id=2, record_shapes=True))
    assert started.error is None and "CPU" in started.message
    assert core.profiler.is_running
    again = _call(core, StartProfile(call_id=3))
    assert again.error == ProfileErrorCode.RUNNING and core.profiler.is_running
    torch.mm(x, x)
    stopped = _call(core, StopProfile(call_id=4))
    assert stopped.error is None and stopped.trace_path is not None
    assert not core.profiler.is_running
    path = Path(stopped.trace_path)
    assert path.parent == folder and path.name.endswith("-4.pt.trace.json")
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert "aten::mm" in names and "aten::cumsum" not in names
    assert _call(core, StopProfile(call_id=5)).error == ProfileErrorCode.NOT_RUNNING
    # a second profile: a file of its own
    _call(core, StartProfile(call_id=6))
    second = _call(core, StopProfile(call_id=7))
    assert second.trace_path is not None and second.trace_path != stopped.trace_path
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [path.name, Path(second.trace_path).name]
    )
