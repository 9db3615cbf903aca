"""`troupe serve --data-parallel-size 2`: two replicas and a router, started and stopped as one."""

from __future__ import annotations

import json
import os
import urllib.request

from troupe.ops.bench_soak import ServerProcess


def _json(url: str, body: object = None) -> dict:  # type: ignore[type-arg]
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return dict(json.loads(resp.read()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_data_parallel_serve_routes_over_its_replicas_and_stops_them() -> None:
    args = ["--data-parallel-size", "2", "--runner", "fake", "--device", "cpu",
            "--no-engine-process", "--max-model-len", "512"]  # fmt: skip
    server = ServerProcess(args)
    try:
        url = server.wait_ready()  # the router's `serving` line: after both replicas serve
        rows = _json(f"{url}/v1/router/stats")["replicas"]
        assert len(rows) == 2 and all(r["is_up"] for r in rows)
        ports = {r["url"] for r in rows}
        assert url not in ports and len(ports) == 2
        for k in range(4):
            out = _json(f"{url}/v1/completions", {"prompt": f"{k}" * 30, "max_tokens": 2})
            assert out["usage"]["completion_tokens"] == 2
        rows = _json(f"{url}/v1/router/stats")["replicas"]
        assert [r["num_routed"] for r in rows] == [2, 2]
        replica_pids = _replica_pids(server.pid)
        assert len(replica_pids) == 2
    finally:
        status = server.stop()
    assert status == 0
    assert not any(_alive(pid) for pid in replica_pids)


def _replica_pids(parent: int) -> list[int]:
    """The parent's child processes (Linux /proc)."""
    path = f"/proc/{parent}/task/{parent}/children"
    with open(path) as f:
        return [int(p) for p in f.read().split()]
