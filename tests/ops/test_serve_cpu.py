"""ops/serve_cpu.py: the server's CPU time, its gateway and its engine child apart."""

from __future__ import annotations

import multiprocessing
import sys
from multiprocessing.synchronize import Event

import pytest
from troupe.child_processes import child_context
from troupe.ops.serve_cpu import ServerCpu, cpu_used, engine_child, read_server_cpu

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _started(ready: Event, release: Event) -> None:
    ready.set()
    release.wait()


def _server(ready: Event, release: Event, joined: Event, finish: Event) -> None:
    """A stand-in server: it starts one engine-like child from its fork server, as
    gateway/engine_launch.py does, and outlives it until told to finish."""
    context = child_context()
    child = context.Process(target=_started, args=(ready, release))
    child.start()
    child.join()
    joined.set()
    finish.wait()


def test_the_fork_servers_child_is_the_engine_and_is_timed_apart() -> None:
    # The server is a process of its own: pytest's may have spawned children of other tests.
    context = multiprocessing.get_context("spawn")
    ready, release, joined, finish = (context.Event() for _ in range(4))
    server = context.Process(target=_server, args=(ready, release, joined, finish))
    server.start()
    try:
        assert ready.wait(60)
        child = engine_child(server.pid)  # type: ignore[arg-type]
        assert child is not None and child != server.pid
        cpu = read_server_cpu(server.pid)  # type: ignore[arg-type]
        assert cpu is not None and cpu.gateway_s > 0  # the server imported multiprocessing
        assert cpu.engine_s is not None and cpu.engine_s >= 0
        release.set()
        assert joined.wait(60)
        after = read_server_cpu(server.pid)  # type: ignore[arg-type]
        assert after is not None and after.engine_s is None  # the child is gone
    finally:
        release.set()
        finish.set()
        server.join()
    assert read_server_cpu(2**22 + 1) is None  # past pid_max: no such process


def test_cpu_used_is_the_difference_and_needs_the_child_both_times() -> None:
    before = ServerCpu(gateway_s=1.0, engine_s=2.0)
    assert cpu_used(before, ServerCpu(gateway_s=1.5, engine_s=5.0)) == ServerCpu(0.5, 3.0)
    assert cpu_used(before, ServerCpu(gateway_s=1.5, engine_s=None)) == ServerCpu(0.5, None)
