"""LoRA adapters loaded and unloaded over HTTP (POST /v1/load_lora_adapter and
/v1/unload_lora_adapter, vLLM's shapes), with the engine in this process and in a child
(RemoteEngine over LoadLora/UnloadLora/LoraReply): GET /v1/models and a request's `model`
follow each change, the runner is told the adapter (a reloaded name runs as `name#2` inside),
errors name their field, the routes exist only with --allow-runtime-lora-updating and stay
behind the API key. The fake runner holds no weights (the registry takes names alone); what a
loaded adapter computes is tested on SmolLM2 at the end."""

from __future__ import annotations

import concurrent.futures
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from troupe.config import ConfigError, EngineConfig
from troupe.gateway.settings import add_settings_arguments, settings_from_args
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.scripted_runner import ParamsRecorder, echo_token, lora_echo_runner

CONFIG = BASE_CONFIG.replace(enable_lora=True)
ALLOW = GatewaySettings(allow_runtime_lora_updating=True)
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
MAX_TOKENS = 3


@pytest.fixture(scope="module")
def in_process() -> Iterator[ServerThread]:
    """The engine in this process around a ParamsRecorder (`srv.runner`)."""
    runner = ParamsRecorder(FakeRunner.from_config(CONFIG))
    srv = ServerThread(CONFIG, ALLOW, runner=runner).start()
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def child() -> Iterator[ServerThread]:
    """The engine in a child process, its runner a LoraEcho (answers name the adapter)."""
    srv = ServerThread(CONFIG, ALLOW, runner_factory=lora_echo_runner).start()
    yield srv
    srv.shutdown()


@pytest.fixture(params=["in_process", "child"])
def server(request: pytest.FixtureRequest) -> ServerThread:
    srv: ServerThread = request.getfixturevalue(request.param)
    return srv


def _request(
    url: str, path: str, body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, str, Any]:
    """(status, content type, the body: JSON decoded, or text)."""
    data = None if body is None else json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(f"{url}{path}", data, all_headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            status, kind, raw = resp.status, resp.headers.get_content_type(), resp.read()
    except urllib.error.HTTPError as exc:
        status, kind, raw = exc.code, exc.headers.get_content_type(), exc.read()
    text = raw.decode()
    return status, kind, json.loads(text) if kind == "application/json" else text


def _load(url: str, name: str, path: str, **headers: str) -> tuple[int, str, Any]:
    return _request(url, LOAD, {"lora_name": name, "lora_path": path}, headers)


def _unload(url: str, name: str, **headers: str) -> tuple[int, str, Any]:
    return _request(url, UNLOAD, {"lora_name": name}, headers)


def _models(srv: ServerThread) -> list[tuple[str, str, str | None]]:
    status, _, body = _request(srv.url, "/v1/models")
    assert status == 200, body
    return [(m["id"], m["root"], m["parent"]) for m in body["data"]]


def _complete(srv: ServerThread, model: str) -> tuple[int, Any]:
    body = {"model": model, "prompt": "SELECT", "max_tokens": MAX_TOKENS, "ignore_eos": True}
    status, _, answer = _request(srv.url, "/v1/completions", body)
    return status, answer


def _ran_on(srv: ServerThread, answer: dict[str, Any], lora: str) -> bool:
    """Whether the runner was told to run `answer`'s request on adapter `lora` (its name inside
    the engine)."""
    if srv.runner is not None:  # in this process: the params the runner got
        return [p.lora for p in srv.runner.take(answer["id"])] == [lora]
    echoed = srv.engine.tokenizer.decode([echo_token(lora)] * MAX_TOKENS)
    return bool(answer["choices"][0]["text"] == echoed)


def _error(answer: Any) -> tuple[str | None, str | None]:
    return answer["error"]["param"], answer["error"]["code"]


def test_load_run_unload_and_load_again(server: ServerThread) -> None:
    base = server.engine.model_name
    assert echo_token("sql") != echo_token("sql#2")  # the child's answers tell them apart

    assert _load(server.url, "sql", "/adapters/sql") == (
        200,
        "text/plain",
        "Success: LoRA adapter 'sql' added successfully.",
    )
    assert server.engine.lora_adapters == {"sql": "/adapters/sql"}
    assert _models(server) == [(base, base, None), ("sql", "/adapters/sql", base)]
    status, answer = _complete(server, "sql")
    assert status == 200 and answer["model"] == "sql", answer
    assert _ran_on(server, answer, "sql")

    assert _unload(server.url, "sql") == (
        200,
        "text/plain",
        "Success: LoRA adapter 'sql' removed successfully.",
    )
    assert server.engine.lora_adapters == {}
    assert _models(server) == [(base, base, None)]
    status, answer = _complete(server, "sql")
    assert status == 404 and _error(answer) == ("model", "model_not_found"), answer

    # the name again, other weights: the runner is told the new adapter's inside name
    assert _load(server.url, "sql", "/adapters/sql-v2")[0] == 200
    assert _models(server) == [(base, base, None), ("sql", "/adapters/sql-v2", base)]
    status, answer = _complete(server, "sql")
    assert status == 200 and answer["model"] == "sql", answer
    assert _ran_on(server, answer, "sql#2")
    status, answer = _complete(server, base)  # the base model stays the base model
    assert status == 200 and not _ran_on(server, answer, "sql#2")
    assert _unload(server.url, "sql")[0] == 200


def test_loads_and_unloads_that_cannot_be_done(server: ServerThread) -> None:
    url = server.url
    assert _load(url, "dup", "/adapters/one")[0] == 200
    status, _, answer = _load(url, "dup", "/adapters/two")
    assert status == 400 and _error(answer) == ("lora_name", "lora_adapter_exists"), answer
    assert answer["error"]["message"] == "a LoRA adapter named 'dup' is already loaded"
    assert server.engine.lora_adapters == {"dup": "/adapters/one"}  # the first one stays
    assert _unload(url, "dup")[0] == 200

    status, _, answer = _unload(url, "ghost")
    assert status == 404 and _error(answer) == ("lora_name", "lora_adapter_not_found"), answer
    assert answer["error"]["message"] == "no LoRA adapter named 'ghost' is loaded"

    status, _, answer = _load(url, "a#b", "/adapters/one")
    assert status == 400 and _error(answer) == ("lora_name", "invalid_value"), answer
    assert "must be 1-128 characters" in answer["error"]["message"]
    status, _, answer = _load(url, "ok", "")
    assert status == 400 and _error(answer) == ("lora_path", "invalid_value"), answer

    bad_bodies = [
        (LOAD, {}, "lora_name", "missing required field"),
        (LOAD, {"lora_name": "x"}, "lora_path", "missing required field"),
        (LOAD, {"lora_name": 7, "lora_path": "/p"}, "lora_name", "Expected `str`"),
        (LOAD, {"lora_name": "x", "lora_path": "/p", "base": 1}, "base", "unknown field"),
        (UNLOAD, {}, "lora_name", "missing required field"),
    ]
    for path, body, field, needle in bad_bodies:
        status, _, answer = _request(url, path, body)
        assert status == 400 and answer["error"]["param"] == field, (body, answer)
        assert needle in answer["error"]["message"], answer
    assert server.engine.lora_adapters == {}  # nothing was loaded by any of them
    assert [m[0] for m in _models(server)] == [server.engine.model_name]


@pytest.mark.parametrize("where", ["in_process", "child"])
def test_an_engine_without_lora_refuses_naming_enable_lora(where: str) -> None:
    runner = FakeRunner.from_config(BASE_CONFIG) if where == "in_process" else None
    srv = ServerThread(BASE_CONFIG, ALLOW, runner=runner).start()
    try:
        status, _, answer = _load(srv.url, "sql", "/adapters/sql")
        assert status == 400 and _error(answer) == ("lora_name", "lora_disabled"), answer
        assert "enable_lora" in answer["error"]["message"]
        assert srv.engine.lora_adapters == {}
    finally:
        srv.shutdown()


def test_an_adapter_in_use_is_not_unloaded() -> None:
    """A request held at its first step is in flight on the adapter: the unload is a 409
    until it ends."""
    runner = FaultyRunner(FakeRunner.from_config(CONFIG), hang_at_step=1)
    srv = ServerThread(CONFIG, ALLOW, runner=runner).start()
    try:
        assert _load(srv.url, "busy", "/adapters/busy")[0] == 200
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(_complete, srv, "busy")
            assert runner.wait_until_held(30)
            status, _, answer = _unload(srv.url, "busy")
            assert status == 409 and _error(answer) == ("lora_name", "lora_adapter_in_use")
            assert "1 requests in flight" in answer["error"]["message"]
            assert srv.engine.lora_adapters == {"busy": "/adapters/busy"}
            runner.release()
            assert pending.result(30)[0] == 200
        assert _unload(srv.url, "busy")[0] == 200
    finally:
        runner.release()
        srv.shutdown()


def test_the_routes_need_the_setting_and_the_api_key(in_process: ServerThread) -> None:
    off = in_process.add_gateway(GatewaySettings())  # the same engine, the default settings
    unknown = _request(off, "/v1/no_such_path", {})
    assert unknown[0] == 404
    for path, body in ((LOAD, {"lora_name": "a", "lora_path": "/a"}), (UNLOAD, {"lora_name": "a"})):
        assert _request(off, path, body) == unknown  # as any unknown path
    assert in_process.engine.lora_adapters == {}

    keyed = in_process.add_gateway(ALLOW.replace(api_key="sesame"))
    status, _, answer = _load(keyed, "k", "/adapters/k")
    assert status == 401 and answer["error"]["code"] == "missing_api_key"
    status, _, answer = _unload(keyed, "k", Authorization="Bearer wrong")
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    assert in_process.engine.lora_adapters == {}
    assert _load(keyed, "k", "/adapters/k", Authorization="Bearer sesame")[0] == 200
    assert _unload(keyed, "k", Authorization="Bearer sesame")[0] == 200
    assert in_process.engine.lora_adapters == {}


def test_the_setting_is_off_by_default_and_a_flag() -> None:
    import argparse

    assert GatewaySettings().allow_runtime_lora_updating is False
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    on = settings_from_args(parser.parse_args(["--allow-runtime-lora-updating"]))
    assert on.allow_runtime_lora_updating is True
    assert settings_from_args(parser.parse_args([])).allow_runtime_lora_updating is False
    with pytest.raises(ConfigError, match="allow_runtime_lora_updating must be a bool"):
        GatewaySettings(allow_runtime_lora_updating="yes")  # type: ignore[arg-type]


# -- the real model: an adapter loaded over HTTP runs as one given by lora_modules ----------


def test_an_adapter_loaded_over_http_runs_as_one_of_lora_modules(tmp_path: Path) -> None:
    from tests.lora.adapters import SMOLLM2_SHAPES as SHAPES
    from tests.lora.adapters import raw_adapter

    # scale 0.06: the greedy text changes within a few tokens (test_lora_model.py)
    folder = raw_adapter(tmp_path / "tiny", num_layers=30, shapes=SHAPES, scale=0.06)
    config = EngineConfig(
        device="cpu",
        max_model_len=256,
        num_kv_blocks=32,
        max_num_seqs=4,
        enable_lora=True,
        lora_modules=(f"tiny={folder}",),
    )
    srv = ServerThread(config, ALLOW).start()  # the engine in a child, as `troupe serve` runs it
    try:
        base = srv.engine.model_name

        def text(model: str) -> str:
            body = {"model": model, "prompt": "The capital of France is", "max_tokens": 12}
            status, _, answer = _request(srv.url, "/v1/completions", {**body, "temperature": 0})
            assert status == 200, answer
            return str(answer["choices"][0]["text"])

        assert _load(srv.url, "over-http", str(folder))[0] == 200
        assert [m[0] for m in _models(srv)] == [base, "tiny", "over-http"]
        on_http, on_modules, on_base = text("over-http"), text("tiny"), text(base)
        assert on_http == on_modules
        assert on_http != on_base, "the loaded adapter changed nothing: is it run?"
        # a folder the runner cannot read: the runner's error, naming lora_path
        status, _, answer = _load(srv.url, "missing", str(tmp_path / "missing"))
        assert status == 400 and _error(answer) == ("lora_path", "invalid_lora_adapter")
        assert "adapter 'missing'" in answer["error"]["message"]
        assert _unload(srv.url, "over-http")[0] == 200
        gone = {"model": "over-http", "prompt": "x", "max_tokens": 1}
        status, _, answer = _request(srv.url, "/v1/completions", gone)
        assert status == 404 and _error(answer) == ("model", "model_not_found")
        assert text("tiny") == on_modules
    finally:
        srv.shutdown()
