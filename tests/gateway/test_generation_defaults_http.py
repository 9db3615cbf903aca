"""The model's generation_config.json reaches every request that leaves a field unset, over
every door: chat, completions, responses, the websocket, beam search and run-batch's calls,
with the engine in this process (the runner records the SamplingParams it is given) and in a
child (the engine's Hello carries the defaults; a response object echoes them). A client's own
value always wins; chat's max_tokens defaults to max_new_tokens, completions' stays 16."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from troupe.gateway.json_calls import answer
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import SamplingParams
from troupe.messages.sampling_defaults import SamplingDefaults
from websockets.sync.client import connect

from tests.actors.test_generation_defaults import QWEN3, model_folder
from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.scripted_runner import ParamsRecorder

# Qwen3's file, with a repetition penalty and a short max_new_tokens (the chat default)
FILE = {**QWEN3, "repetition_penalty": 1.05, "max_new_tokens": 4}
DEFAULTS = SamplingDefaults(
    temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05, max_tokens=4
)
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
_http = urllib3.PoolManager()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_folder(tmp_path_factory.mktemp("models") / "qwen3", FILE)


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerThread]:
    """The engine in this process on the model folder, its runner a ParamsRecorder."""
    config = BASE_CONFIG.replace(model=str(folder))
    runner = ParamsRecorder(FakeRunner.from_config(config))
    srv = ServerThread(config, GatewaySettings(), runner=runner).start()
    yield srv
    srv.shutdown()


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    resp = _http.request("POST", f"{url}{path}", json=body, timeout=30, retries=False)
    return resp.status, json.loads(resp.data)


def _sent(server: ServerThread, path: str, body: dict[str, Any]) -> SamplingParams:
    """The SamplingParams the runner was given for one request to `path`."""
    server.runner.take()
    status, answer = _post(server.url, path, body)
    assert status == 200, answer
    (params,) = server.runner.take()
    return params


def _sampling(params: SamplingParams) -> SamplingDefaults:
    return SamplingDefaults(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        repetition_penalty=params.repetition_penalty,
        max_tokens=params.max_tokens,
    )


def test_the_engine_read_the_models_file(server: ServerThread) -> None:
    assert server.engine.sampling_defaults == DEFAULTS


def test_chat_gets_the_files_defaults_where_the_body_is_silent(server: ServerThread) -> None:
    assert _sampling(_sent(server, "/v1/chat/completions", CHAT)) == DEFAULTS
    own = {**CHAT, "temperature": 0.1, "top_k": 5, "max_tokens": 3}
    params = _sent(server, "/v1/chat/completions", own)
    assert _sampling(params) == SamplingDefaults(
        temperature=0.1, top_p=0.95, top_k=5, repetition_penalty=1.05, max_tokens=3
    )
    # greedy and "off" are values too: a client's 0 is not "unset"
    zero = _sent(server, "/v1/chat/completions", {**CHAT, "temperature": 0, "top_k": 0})
    assert (zero.temperature, zero.top_k, zero.top_p) == (0.0, 0, 0.95)


def test_completions_get_them_and_keep_openais_16_tokens(server: ServerThread) -> None:
    params = _sent(server, "/v1/completions", {"prompt": "hi"})
    assert _sampling(params) == SamplingDefaults(
        temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05, max_tokens=16
    )
    own = _sent(server, "/v1/completions", {"prompt": "hi", "top_p": 0.5, "max_tokens": 2})
    assert (own.top_p, own.temperature, own.max_tokens) == (0.5, 0.6, 2)


def test_responses_get_them_and_echo_them(server: ServerThread) -> None:
    server.runner.take()
    status, body = _post(server.url, "/v1/responses", {"input": "hi"})
    assert status == 200, body
    (params,) = server.runner.take()
    assert _sampling(params) == DEFAULTS
    assert (body["temperature"], body["top_p"]) == (0.6, 0.95)
    own = _sent(server, "/v1/responses", {"input": "hi", "temperature": 1.0})
    assert (own.temperature, own.top_k) == (1.0, 20)


def test_websocket_frames_get_them(server: ServerThread) -> None:
    server.runner.take()
    url = server.url.replace("http://", "ws://") + "/v1/ws"
    with connect(url) as ws:
        for request_id, extra in (("a", {}), ("b", {"temperature": 0.2, "max_tokens": 2})):
            ws.send(json.dumps({"type": "generate", "request_id": request_id, **extra,
                                "messages": CHAT["messages"]}))  # fmt: skip
            while (frame := json.loads(ws.recv(timeout=30)))["type"] == "delta":
                pass
            assert frame["type"] == "done", frame
            (params,) = server.runner.take()
            if request_id == "a":  # max_tokens: SamplingParams' 16, as completions
                assert _sampling(params) == SamplingDefaults(
                    temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05, max_tokens=16
                )
            else:
                assert (params.temperature, params.top_p, params.max_tokens) == (0.2, 0.95, 2)


def test_beam_search_takes_the_max_tokens_default_and_no_penalty(server: ServerThread) -> None:
    """A default repetition_penalty would refuse a beam search (beams sample nothing): only
    the max_tokens default applies, and its rounds run greedy as always."""
    server.runner.take()
    status, body = _post(server.url, "/v1/chat/completions", {**CHAT, "use_beam_search": True})
    assert status == 200, body
    assert 1 <= body["usage"]["completion_tokens"] <= DEFAULTS.max_tokens  # type: ignore[operator]
    rounds = server.runner.take()
    assert rounds and all(p.temperature == 0.0 and p.repetition_penalty == 1.0 for p in rounds)


def test_run_batch_calls_get_them(server: ServerThread) -> None:
    server.runner.take()
    raw = json.dumps(CHAT).encode()
    got = server.call(answer(server.gateway, "/v1/chat/completions", raw))
    assert got.status == 200, got.body
    (params,) = server.runner.take()
    assert _sampling(params) == DEFAULTS


def test_an_engine_in_a_child_sends_them_in_its_hello(folder: Path) -> None:
    """The override wins over the file; the gateway across the process boundary applies it."""
    config = BASE_CONFIG.replace(model=str(folder), override_generation_config={"top_p": 0.5})
    srv = ServerThread(config, GatewaySettings()).start()
    try:
        assert type(srv.engine).__name__ == "RemoteEngine"
        expected = SamplingDefaults(
            temperature=0.6, top_p=0.5, top_k=20, repetition_penalty=1.05, max_tokens=4
        )
        assert srv.engine.sampling_defaults == expected
        status, body = _post(srv.url, "/v1/responses", {"input": "hi"})
        assert status == 200, body
        assert (body["temperature"], body["top_p"], body["max_output_tokens"]) == (0.6, 0.5, None)
        assert body["usage"]["output_tokens"] <= 4

        async def generate_bare() -> list[Any]:  # the Python API given no params, as Engine's
            return [event async for event in srv.engine.generate([100, 101, 102])]

        assert srv.engine.sampling_defaults.params(64).max_tokens == 4
        last = srv.call(generate_bare())[-1]
        assert last.finish_reason == "length" and last.usage.completion_tokens == 4  # not 16
    finally:
        srv.shutdown()
