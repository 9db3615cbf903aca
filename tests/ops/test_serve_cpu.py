"""ops/serve_cpu.py: the server's CPU time, its gateway and its spawned engine child apart."""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing.synchronize import Event

import pytest
from troupe.ops.serve_cpu import ServerCpu, cpu_used, engine_child, read_server_cpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _started(ready: Event, release: Event) -> None:
    ready.set()
    release.wait()


def test_a_spawned_child_is_the_engine_and_is_timed_apart() -> None:
    context = multiprocessing.get_context("spawn")  # as gateway/engine_launch.py starts it
    ready, release = context.Event(), context.Event()
    child = context.Process(target=_started, args=(ready, release))
    child.start()  # returns before the child's exec: its command line is ours until then
    try:
        assert ready.wait(60)
        assert engine_child(os.getpid()) == child.pid
        cpu = read_server_cpu(os.getpid())
        assert cpu is not None and cpu.gateway_s > 0  # this process imported pytest
        assert cpu.engine_s is not None and cpu.engine_s >= 0
    finally:
        release.set()
        child.join()
    after = read_server_cpu(os.getpid())
    assert after is not None and after.engine_s is None  # the child is gone
    assert read_server_cpu(2**22 + 1) is None  # past pid_max: no such process


def test_cpu_used_is_the_difference_and_needs_the_child_both_times() -> None:
    before = ServerCpu(gateway_s=1.0, engine_s=2.0)
    assert cpu_used(before, ServerCpu(gateway_s=1.5, engine_s=5.0)) == ServerCpu(0.5, 3.0)
    assert cpu_used(before, ServerCpu(gateway_s=1.5, engine_s=None)) == ServerCpu(0.5, None)
