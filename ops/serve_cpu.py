"""CPU time of a `troupe serve` that a benchmark started: its gateway process and its engine
child apart, so a run shows what the gateway costs per output token (issue 9: the gateway must
not tax the engine). Read from Linux's /proc; elsewhere there is nothing to read (None).

The engine child is the child of the server's fork server (troupe/child_processes.py: the
server's child with `multiprocessing.forkserver` in its command line, which its forks share);
multiprocessing's resource tracker is not it. With `--no-engine-process` there is no such
child: the engine's CPU time is the gateway process's (`engine_s` None).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

_PROC = Path("/proc")


@dataclasses.dataclass(frozen=True)
class ServerCpu:
    """CPU seconds (user + system) used so far."""

    gateway_s: float
    engine_s: float | None  # None: no engine child, the engine runs in the gateway's process


def read_server_cpu(pid: int) -> ServerCpu | None:
    """The server's CPU time now; None where /proc cannot tell (not Linux, process gone)."""
    gateway = cpu_seconds(pid)
    if gateway is None:
        return None
    child = engine_child(pid)
    return ServerCpu(gateway_s=gateway, engine_s=cpu_seconds(child) if child else None)


def cpu_used(before: ServerCpu, after: ServerCpu) -> ServerCpu:
    """CPU seconds between two readings (the engine's only if both saw the same child)."""
    engine = None
    if before.engine_s is not None and after.engine_s is not None:
        engine = after.engine_s - before.engine_s
    return ServerCpu(gateway_s=after.gateway_s - before.gateway_s, engine_s=engine)


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, in seconds (None if it cannot be read)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def engine_child(pid: int) -> int | None:
    """The server's engine process, if it has one: its fork server's only child."""
    for child in _children(pid):
        try:
            command = (_PROC / str(child) / "cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing.forkserver" in command:
            forks = _children(child)
            return forks[0] if forks else None
    return None


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return children
    for task in tasks:
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children
