"""LoRA adapters and cache_salt over HTTP and websockets, against fake-runner engines: a
request's `model` picks the adapter (SamplingParams.lora, seen by the runner), GET /v1/models
lists the adapters (from the engine child's Hello), an unknown model is a 404 listing them,
and the router passes all of it through. The runner here never loads the folders: what an
adapter computes is tested on SmolLM2 (test_lora_model.py) and in tests/lora."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from websockets.asyncio.client import connect

from tests.gateway.conftest import BASE_CONFIG, ServerThread, openai_client
from tests.gateway.router_harness import RouterThread
from tests.gateway.scripted_runner import ParamsRecorder

ADAPTERS = {"sql": "/adapters/sql", "chat-v2": "/adapters/chat"}
CONFIG = BASE_CONFIG.replace(lora_modules=tuple(f"{k}={v}" for k, v in ADAPTERS.items()))
USER = [{"role": "user", "content": "Write a query."}]


@pytest.fixture(scope="module")
def recorded() -> Iterator[ServerThread]:
    """The engine in this process around a ParamsRecorder (`srv.runner`)."""
    srv = ServerThread(
        CONFIG, GatewaySettings(), runner=ParamsRecorder(FakeRunner.from_config(CONFIG))
    )
    yield srv.start()
    srv.shutdown()


@pytest.fixture(scope="module")
def child() -> Iterator[ServerThread]:
    """The engine in a child process, as `troupe serve` runs it: the adapters come in Hello."""
    srv = ServerThread(CONFIG, GatewaySettings()).start()
    yield srv
    srv.shutdown()


def _post(url: str, path: str, body: object) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            raw = resp.read().decode()
            if resp.headers.get_content_type() == "text/event-stream":
                events = [line[6:] for line in raw.splitlines() if line.startswith("data: {")]
                return resp.status, [json.loads(e) for e in events]
            return resp.status, json.loads(raw)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# (path, body): each endpoint whose `model` selects the adapter
ENDPOINTS = {
    "completion": ("/v1/completions", {"prompt": "SELECT", "max_tokens": 3}),
    "completion-n": ("/v1/completions", {"prompt": ["a", "b"], "n": 2, "max_tokens": 2}),
    "chat": ("/v1/chat/completions", {"messages": USER, "max_tokens": 3}),
    "chat-stream": ("/v1/chat/completions", {"messages": USER, "max_tokens": 3, "stream": True}),
    "embeddings": ("/v1/embeddings", {"input": ["one", "two"]}),
}


def test_the_engine_process_tells_the_gateway_its_adapters(child: ServerThread) -> None:
    assert child.engine.lora_adapters == ADAPTERS  # a RemoteEngine: from Hello
    listed = openai_client(child.url).models.list().data
    base = child.engine.model_name
    assert [openai_client(child.url).models.retrieve(m.id) for m in listed] == listed
    assert [(m.id, m.root, m.parent) for m in listed] == [  # type: ignore[attr-defined]
        (base, base, None),
        ("sql", "/adapters/sql", base),
        ("chat-v2", "/adapters/chat", base),
    ]
    assert {m.max_model_len for m in listed} == {child.engine.max_model_len}  # type: ignore[attr-defined]
    answer = openai_client(child.url).completions.create(model="chat-v2", prompt="x", max_tokens=2)
    assert answer.model == "chat-v2" and answer.choices[0].text


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
@pytest.mark.parametrize("model", ["sql", "base", None])
def test_model_selects_the_adapter_on_every_endpoint(
    recorded: ServerThread, endpoint: str, model: str | None
) -> None:
    path, body = ENDPOINTS[endpoint]
    base = recorded.engine.model_name
    given = {"model": base if model == "base" else model} if model else {}
    recorded.runner.take()
    status, answer = _post(recorded.url, path, {**body, **given})
    assert status == 200, answer
    chunks = answer if isinstance(answer, list) else [answer]
    expected_lora = "sql" if model == "sql" else None
    assert {c["model"] for c in chunks} == {expected_lora or base}
    seen = recorded.runner.take(chunks[0]["id"])
    num_requests = {"completion-n": 4, "embeddings": 2}.get(endpoint, 1)
    assert len(seen) == num_requests
    assert {p.lora for p in seen} == {expected_lora}


@pytest.mark.parametrize("endpoint", ["completion", "chat", "embeddings"])
def test_an_unknown_model_is_a_404_naming_the_adapters(
    recorded: ServerThread, endpoint: str
) -> None:
    path, body = ENDPOINTS[endpoint]
    recorded.runner.take()
    status, answer = _post(recorded.url, path, {**body, "model": "mysql"})
    assert status == 404, answer
    error = answer["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    base = recorded.engine.model_name
    assert error["message"] == (
        "model 'mysql' does not exist; this server serves the model and its LoRA adapters: "
        f"'{base}', 'sql', 'chat-v2'"
    )
    assert recorded.runner.take() == []  # nothing ran
    with pytest.raises(openai.NotFoundError, match="'sql', 'chat-v2'"):
        openai_client(recorded.url).chat.completions.create(model="mysql", messages=USER)  # type: ignore[arg-type]


def test_tokenize_accepts_an_adapter_name(recorded: ServerThread) -> None:
    status, plain = _post(recorded.url, "/tokenize", {"prompt": "SELECT 1"})
    assert status == 200
    assert _post(recorded.url, "/tokenize", {"prompt": "SELECT 1", "model": "sql"}) == (200, plain)
    status, answer = _post(recorded.url, "/detokenize", {"tokens": [5], "model": "nope"})
    assert status == 404 and answer["error"]["param"] == "model"


@pytest.mark.parametrize("endpoint", ["completion", "chat-stream"])
def test_cache_salt_reaches_the_engine(recorded: ServerThread, endpoint: str) -> None:
    path, body = ENDPOINTS[endpoint]
    recorded.runner.take()
    status, answer = _post(recorded.url, path, {**body, "model": "sql", "cache_salt": "tenant-7"})
    assert status == 200, answer
    chunks = answer if isinstance(answer, list) else [answer]
    (params,) = recorded.runner.take(chunks[0]["id"])
    assert (params.lora, params.cache_salt) == ("sql", "tenant-7")


@pytest.mark.parametrize(
    ("salt", "needle"), [("", "1 to 256 characters"), ("s" * 257, "got 257"), (7, "Expected `str")]
)
def test_a_bad_cache_salt_is_a_400_naming_it(
    recorded: ServerThread, salt: Any, needle: str
) -> None:
    for path, body in (ENDPOINTS["completion"], ENDPOINTS["chat"]):
        status, answer = _post(recorded.url, path, {**body, "cache_salt": salt})
        assert status == 400 and answer["error"]["param"] == "cache_salt", answer
        assert needle in answer["error"]["message"]


def test_beam_search_runs_every_round_on_the_adapter(recorded: ServerThread) -> None:
    body = {
        "prompt": "SELECT",
        "model": "sql",
        "n": 2,
        "max_tokens": 2,
        "use_beam_search": True,
        "cache_salt": "s",
    }
    recorded.runner.take()
    status, answer = _post(recorded.url, "/v1/completions", body)
    assert status == 200 and answer["model"] == "sql" and len(answer["choices"]) == 2, answer
    seen = recorded.runner.take()  # the rounds' requests carry ids of their own
    assert len(seen) >= 3  # one first round, then one request per live beam
    assert {(p.lora, p.cache_salt) for p in seen} == {("sql", "s")}


@pytest.mark.anyio
async def test_websocket_frames_name_the_adapter_as_lora(recorded: ServerThread) -> None:
    recorded.runner.take()
    url = recorded.url.replace("http://", "ws://") + "/v1/ws"
    frame = {"type": "generate", "prompt": "SELECT", "max_tokens": 2, "cache_salt": "t"}
    async with connect(url) as ws:
        await ws.send(json.dumps({**frame, "request_id": "on-sql", "lora": "sql"}))
        await ws.send(json.dumps({**frame, "request_id": "unknown", "lora": "mysql"}))
        ends: dict[str, dict[str, Any]] = {}
        while len(ends) < 2:
            got = json.loads(await ws.recv())
            if got["type"] in ("done", "error"):
                ends[got["request_id"]] = got
    assert ends["on-sql"]["type"] == "done"
    (params,) = recorded.runner.take()  # the unknown adapter never reached the runner
    assert (params.lora, params.cache_salt) == ("sql", "t")
    refused = ends["unknown"]
    assert refused["type"] == "error" and refused["field"] == "lora"
    assert "no adapter named 'mysql'" in refused["message"] and "chat-v2, sql" in refused["message"]


async def _ws_ends(srv: ServerThread, frames: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each frame sent on one socket under its request id -> its done or error frame."""
    url = srv.url.replace("http://", "ws://") + "/v1/ws"
    base = {"type": "generate", "prompt": "SELECT", "max_tokens": 2}
    async with connect(url) as ws:
        for request_id, fields in frames.items():
            await ws.send(json.dumps({**base, **fields, "request_id": request_id}))
        ends: dict[str, dict[str, Any]] = {}
        while len(ends) < len(frames):
            got = json.loads(await ws.recv())
            if got["type"] in ("done", "error"):
                ends[got["request_id"]] = got
    return ends


@pytest.mark.anyio
async def test_websocket_frames_name_the_adapter_as_model(recorded: ServerThread) -> None:
    base = recorded.engine.model_name
    # request id -> (frame fields, the adapter the runner sees)
    served = {
        "adapter": ({"model": "sql"}, "sql"),
        "base": ({"model": base}, None),
        "empty": ({"model": ""}, None),
        "absent": ({}, None),
        "both": ({"model": "chat-v2", "lora": "chat-v2"}, "chat-v2"),
        "lora": ({"lora": "chat-v2"}, "chat-v2"),
        "null": ({"model": None, "lora": "sql"}, "sql"),
    }
    recorded.runner.take()
    ends = await _ws_ends(recorded, {rid: fields for rid, (fields, _) in served.items()})
    assert {rid: end["type"] for rid, end in ends.items()} == dict.fromkeys(served, "done")
    seen = recorded.runner.params  # engine ids end with "-<client id>"
    for rid, (_, lora) in served.items():
        (params,) = [p for engine_id, p in seen.items() if engine_id.endswith(f"-{rid}")]
        assert params.lora == lora, rid
    recorded.runner.take()


@pytest.mark.anyio
async def test_websocket_model_refused_as_over_http(recorded: ServerThread) -> None:
    base = recorded.engine.model_name
    refused = {
        "unknown": {"model": "mysql"},
        "adapter-vs-lora": {"model": "sql", "lora": "chat-v2"},
        "base-vs-lora": {"model": base, "lora": "sql"},
        "not-a-name": {"model": 7},
    }
    recorded.runner.take()
    ends = await _ws_ends(recorded, refused)
    assert recorded.runner.take() == []  # nothing reached the runner
    got = {rid: (end["type"], end["code"], end["field"]) for rid, end in ends.items()}
    assert got == {
        "unknown": ("error", "model_not_found", "model"),
        "adapter-vs-lora": ("error", "invalid_request", "lora"),
        "base-vs-lora": ("error", "invalid_request", "lora"),
        "not-a-name": ("error", "invalid_request", "model"),
    }
    # the same words as HTTP's 404: what this server serves
    path, body = ENDPOINTS["completion"]
    _, answer = _post(recorded.url, path, {**body, "model": "mysql"})
    assert ends["unknown"]["message"] == answer["error"]["message"]
    assert "'sql', 'chat-v2'" in ends["unknown"]["message"]
    assert ends["adapter-vs-lora"]["message"] == (
        "'model' selects the adapter 'sql' but 'lora' names the adapter 'chat-v2':"
        " send one of them, or both naming the same adapter"
    )
    expected = f"'model' selects the base model '{base}' but 'lora' names the adapter 'sql'"
    assert expected in ends["base-vs-lora"]["message"]
    assert "Expected `str | null`" in ends["not-a-name"]["message"]


def test_the_router_lists_and_routes_adapters(child: ServerThread) -> None:
    settings = RouterSettings(backend_urls=(child.url,), health_check_interval_s=3600.0)
    router = RouterThread().start_router(settings)
    try:
        via, direct = openai_client(router.url), openai_client(child.url)
        assert [m.id for m in via.models.list().data] == [m.id for m in direct.models.list().data]
        for name in (child.engine.model_name, "sql"):  # OpenAI's retrieve, through the router
            assert via.models.retrieve(name) == direct.models.retrieve(name)
        with pytest.raises(openai.NotFoundError, match="'nope' does not exist"):
            via.models.retrieve("nope")
        kw: dict[str, Any] = {"prompt": "SELECT", "max_tokens": 3, "temperature": 0}
        answer = via.completions.create(model="sql", **kw)
        assert answer.model == "sql"
        assert (
            answer.choices[0].text == direct.completions.create(model="sql", **kw).choices[0].text
        )
        with pytest.raises(openai.NotFoundError, match="'sql', 'chat-v2'"):  # the replica's 404
            via.completions.create(model="mysql", **kw)
    finally:
        router.close()
