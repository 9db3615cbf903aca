"""`python -m troupe serve` and its engine process: clear start-up errors in both placements,
exit 1 when the engine process dies, and no orphan engine when the server dies."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from troupe.gateway.server import add_serve_arguments
from troupe.gateway.settings import settings_from_args

HANG = 60  # s: a hang detector only
_FAKE = ["--runner", "fake", "--device", "cpu", "--num-kv-blocks", "256", "--port", "0"]


def _serve(*flags: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "troupe", "serve", *_FAKE, *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def _engine_pid(proc: subprocess.Popen[str]) -> int:
    """The engine process's pid, from the server's log; returns once the server listens."""
    assert proc.stdout is not None
    pid, lines = None, []
    for line in proc.stdout:
        lines.append(line)
        if match := re.search(r"engine process started\s+pid=(\d+)", line):
            pid = int(match.group(1))
        if "serving" in line and pid is not None:
            return pid
    raise AssertionError("the server never served:\n" + "".join(lines))


def _is_gone(pid: int) -> bool:
    """Exited (a zombie waiting for whoever adopted it counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_the_engine_process_is_the_default_and_a_flag_turns_it_off() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert settings_from_args(parser.parse_args([])).engine_process is True
    off = settings_from_args(parser.parse_args(["--no-engine-process"]))
    assert off.engine_process is False


@pytest.mark.parametrize("placement", ["--engine-process", "--no-engine-process"])
def test_a_bad_model_path_is_one_clear_line_and_exit_1(placement: str) -> None:
    proc = _serve(placement, "--model", "/nonexistent/model")
    out, _ = proc.communicate(timeout=HANG)
    assert proc.returncode == 1
    assert "troupe serve: model path '/nonexistent/model' does not exist" in out
    assert "Traceback" not in out


def test_serve_exits_1_when_its_engine_process_dies() -> None:
    proc = _serve()
    try:
        os.kill(_engine_pid(proc), signal.SIGKILL)
        out, _ = proc.communicate(timeout=HANG)
        assert proc.returncode == 1
        assert "engine failed; exiting" in out and "exit code -9" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_engine_process_exits_when_the_server_dies() -> None:
    proc = _serve()
    pid = _engine_pid(proc)
    proc.kill()  # SIGKILL: the server gets no chance to stop its engine
    proc.wait()
    deadline = time.monotonic() + HANG
    while not _is_gone(pid):  # its socket closed: the engine stops by itself
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"the engine process {pid} outlived its server")
        time.sleep(0.05)
