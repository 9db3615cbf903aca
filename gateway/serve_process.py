"""A `troupe serve` child process seen from its parent (gateway/router_launch.py's replicas,
ops/bench_soak.py's server): its URL from the `serving` line of its JSON log
(gateway/server.py logs it once it listens), and a stop that lets it drain.
"""

from __future__ import annotations

import json
import signal
import subprocess


def serving_url(line: str) -> str | None:
    """The URL a JSON log line announces (`"event": "serving"`); None for any other line."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if isinstance(event, dict) and event.get("event") == "serving":
        return str(event["url"])
    return None


def stop_serving(proc: subprocess.Popen[str], timeout: float) -> int | None:
    """SIGTERM (a graceful drain), then the exit status; None if it had to be killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
