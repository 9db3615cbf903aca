"""`python -m troupe serve`: one ready line with the URL; SIGTERM drains and exits 0."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

from troupe.gateway.server import add_serve_arguments


def test_serve_arguments_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args([])
    assert (args.host, args.port, args.api_key, args.shutdown_grace) == (
        "127.0.0.1",
        8000,
        None,
        30.0,
    )
    args = parser.parse_args(["--host", "0.0.0.0", "--port", "0", "--api-key", "k"])
    assert (args.host, args.port, args.api_key) == ("0.0.0.0", 0, "k")


def test_serve_logs_url_and_exits_0_on_sigterm() -> None:
    cmd = [
        sys.executable,
        "-m",
        "troupe",
        "serve",
        "--runner",
        "fake",
        "--device",
        "cpu",
        "--num-kv-blocks",
        "64",
        "--num-cpu-blocks",
        "0",
        "--port",
        "0",
        "--shutdown-grace",
        "1",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 90
        url = None
        lines = []
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if match := re.search(r"serving .*url=(http://127\.0\.0\.1:\d+)", line):
                url = match.group(1)
        assert url is not None, "no ready line:\n" + "".join(lines)
        assert sum("serving" in line for line in lines) == 1
        with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
