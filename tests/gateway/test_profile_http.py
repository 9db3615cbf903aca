"""POST /start_profile and /stop_profile (vLLM's and SGLang's) against a fake-runner engine in
its child process, as `troupe serve --profiler-dir DIR` runs: a profile spans the steps of the
requests served meanwhile and its trace lands in the folder; one at a time; a stop with none
running is a 409; SGLang's fields troupe does not take are 400s naming them; an engine without
a folder says how to turn profiling on; through the router, every replica profiles."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.router_harness import RouterThread


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def srv(folder: Path) -> Iterator[ServerThread]:
    server = ServerThread(BASE_CONFIG.replace(profiler_dir=str(folder)), GatewaySettings())
    yield server.start()
    server.shutdown()


def _post(url: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_profile_spans_the_requests_meanwhile(srv: ServerThread, folder: Path) -> None:
    assert _post(f"{srv.url}/stop_profile")[0] == 409
    status, body = _post(f"{srv.url}/start_profile")  # no body, as vLLM's clients send
    assert (status, body["success"]) == (200, True), body
    status, body = _post(f"{srv.url}/start_profile", {})
    assert status == 409 and body["code"] == "profile_running", body
    done = _post(f"{srv.url}/v1/completions", {"prompt": "hello", "max_tokens": 5})
    assert done[0] == 200 and done[1]["usage"]["completion_tokens"] == 5
    status, body = _post(f"{srv.url}/stop_profile")
    assert status == 200 and body["success"], body
    path = Path(body["trace_path"])
    assert path.parent == folder and path.is_file()
    assert path.name in body["message"]
    assert isinstance(json.loads(path.read_text())["traceEvents"], list)
    assert _post(f"{srv.url}/stop_profile")[1]["code"] == "no_profile_running"
    # SGLang's body, with the options troupe takes
    status, body = _post(f"{srv.url}/start_profile", {"record_shapes": True, "with_stack": False})
    assert status == 200, body
    assert _post(f"{srv.url}/stop_profile")[0] == 200
    assert len(list(folder.iterdir())) == 2


@pytest.mark.parametrize("field", ["output_dir", "num_steps", "activities"])
def test_fields_troupe_does_not_take_are_named(srv: ServerThread, field: str) -> None:
    status, body = _post(f"{srv.url}/start_profile", {field: 3 if field == "num_steps" else "x"})
    assert status == 400 and body["error"]["param"] == field, body


def test_without_a_folder_profiling_is_off(server: ServerThread) -> None:
    status, body = _post(f"{server.url}/start_profile")
    assert status == 400 and body["code"] == "profiling_off", body
    assert "--profiler-dir" in body["message"]


def test_the_router_sends_it_to_every_replica(srv: ServerThread, folder: Path) -> None:
    second = srv.add_gateway(GatewaySettings())  # another replica's front on the same engine
    settings = RouterSettings(backend_urls=(srv.url, second), health_check_interval_s=3600.0)
    router = RouterThread().start_router(settings)
    try:
        before = set(folder.iterdir())
        status, body = _post(f"{router.url}/start_profile")
        # the second front reaches the same engine: its start finds the first one's running
        assert status == 409 and "succeeded on" in body["message"], body
        status, body = _post(f"{router.url}/stop_profile")
        assert status == 409, body  # likewise: one stop wrote the trace, the other found none
        assert len(set(folder.iterdir()) - before) == 1
    finally:
        router.close()
