"""`python -m troupe serve`: one ready line with the URL; signals drain and exit 0."""

from __future__ import annotations

import argparse
import http.client
import json
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


def _start(*flags: str) -> tuple[subprocess.Popen[str], str, list[str]]:
    cmd = [sys.executable, "-m", "troupe", "serve", "--runner", "fake", "--device", "cpu",
           "--num-kv-blocks", "1024", "--num-cpu-blocks", "0", "--port", "0", *flags]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    deadline = time.monotonic() + 90
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if match := re.search(r"serving .*url=(http://127\.0\.0\.1:\d+)", line):
            return proc, match.group(1), lines
    proc.kill()
    raise AssertionError("no ready line:\n" + "".join(lines))


def test_sigterm_drains_and_exits_0() -> None:
    proc, url, lines = _start("--shutdown-grace", "1")
    try:
        assert sum("serving" in line for line in lines) == 1
        with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None and "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_second_signal_cuts_the_grace_short() -> None:
    """SIGTERM starts an hour's drain; SIGINT then aborts the in-flight stream at once (the
    process exits long before the grace would end: no bound here depends on speed)."""
    proc, url, _ = _start("--shutdown-grace", "3600")
    try:
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
        body = {"prompt": "x", "max_tokens": 8000, "ignore_eos": True, "stream": True}
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rest = resp.read().decode()
        assert rest.endswith("data: [DONE]\n\n")
        error = json.loads(rest.strip().split("\n\n")[-2].removeprefix("data: "))["error"]
        assert error["code"] == "aborted" and "shutting down" in error["message"]
        assert proc.wait(timeout=600) == 0  # a hang guard, far below the grace
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_server_process_never_loads_torch() -> None:
    """The model runs in the engine's child process: the server's own (HTTP, tokenizer for
    chat templates, metrics) needs no torch, ~180 MiB of RSS it no longer maps."""
    proc, url, _ = _start()
    try:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        request = urllib.request.Request(
            f"{url}/v1/chat/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert json.load(resp)["usage"]["completion_tokens"] == 4
        with urllib.request.urlopen(f"{url}/metrics", timeout=60) as resp:
            assert resp.status == 200
        with open(f"/proc/{proc.pid}/maps") as maps:
            libraries = {line.split()[-1] for line in maps if "/" in line}
        assert not [lib for lib in libraries if "libtorch" in lib or "libtriton" in lib]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
