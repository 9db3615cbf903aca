"""--served-model-name (vLLM's) over every surface that names the model, on a fake-runner engine
in its child process (as `troupe serve` runs it) with two LoRA adapters: each served name runs
the base model and the first is what answers, /v1/models' adapters' parent, /health and
/metrics carry; the engine's own id is then a 404, on HTTP and the websocket alike; the router
lists what the replica lists; `troupe run-batch` and the data-parallel replicas take the flag.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from troupe.config import DEFAULT_MODEL_NAME
from troupe.gateway.router_launch import replica_args
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.ops.cli import build_parser
from troupe.ops.run_batch import run_batch_command
from websockets.asyncio.client import connect

from tests.gateway.conftest import BASE_CONFIG, ServerThread, openai_client
from tests.gateway.router_harness import RouterThread

NAMES = ("gpt-x", "alias")
ADAPTERS = {"sql": "/adapters/sql", "chat-v2": "/adapters/chat"}
CONFIG = BASE_CONFIG.replace(lora_modules=tuple(f"{k}={v}" for k, v in ADAPTERS.items()))
USER = [{"role": "user", "content": "Write a query."}]
SERVED = "'gpt-x', 'alias', 'sql', 'chat-v2'"  # what a 404 lists


@pytest.fixture(scope="module")
def named() -> Iterator[ServerThread]:
    srv = ServerThread(CONFIG, GatewaySettings(served_model_name=NAMES)).start()
    yield srv
    srv.shutdown()


def _call(url: str, path: str, body: object | None = None) -> tuple[int, Any]:
    """GET (no body) or POST JSON; (status, JSON, or an SSE stream's chunks, or text)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            raw = resp.read().decode()
            kind = resp.headers.get_content_type()
            if kind == "text/event-stream":
                events = [line[6:] for line in raw.splitlines() if line.startswith("data: {")]
                return resp.status, [json.loads(e) for e in events]
            return resp.status, json.loads(raw) if kind == "application/json" else raw
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_models_lists_each_name_then_the_adapters_under_the_first(named: ServerThread) -> None:
    status, body = _call(named.url, "/v1/models")
    assert status == 200
    engine_id = named.engine.model_name  # what the model would be called without the flag
    assert engine_id == DEFAULT_MODEL_NAME
    assert [(m["id"], m["root"], m["parent"]) for m in body["data"]] == [
        ("gpt-x", engine_id, None),
        ("alias", engine_id, None),
        ("sql", "/adapters/sql", "gpt-x"),
        ("chat-v2", "/adapters/chat", "gpt-x"),
    ]


# (path, body without model, how the answer names the model)
ENDPOINTS = {
    "completion": ("/v1/completions", {"prompt": "SELECT", "max_tokens": 3}, "model"),
    "chat": ("/v1/chat/completions", {"messages": USER, "max_tokens": 3}, "model"),
    "chat-stream": (
        "/v1/chat/completions",
        {"messages": USER, "max_tokens": 3, "stream": True},
        "chunks",
    ),
    "completion-stream": (
        "/v1/completions",
        {"prompt": "SELECT", "max_tokens": 3, "stream": True},
        "chunks",
    ),
    "responses": ("/v1/responses", {"input": "Hello", "max_output_tokens": 3}, "model"),
    "embeddings": ("/v1/embeddings", {"input": ["one", "two"]}, "model"),
    "score": ("/v1/score", {"text_1": "a query", "text_2": ["doc one", "doc two"]}, "model"),
    "rerank": ("/v1/rerank", {"query": "a query", "documents": ["one", "two"]}, "model"),
}


def _models(answer: Any, how: str) -> set[str]:
    return {c["model"] for c in answer} if how == "chunks" else {answer["model"]}


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_every_name_runs_the_base_model_and_answers_name_the_first(
    named: ServerThread, endpoint: str
) -> None:
    path, body, how = ENDPOINTS[endpoint]
    for model in ("alias", "gpt-x", None):
        sent = body if model is None else {**body, "model": model}
        status, answer = _call(named.url, path, sent)
        assert status == 200, (model, answer)
        assert _models(answer, how) == {"gpt-x"}, model
    status, answer = _call(named.url, path, {**body, "model": "sql"})
    assert status == 200 and _models(answer, how) == {"sql"}, answer
    # the engine's own id is not a served name any more (vLLM's rule)
    status, answer = _call(named.url, path, {**body, "model": named.engine.model_name})
    assert (status, answer["error"]["param"], answer["error"]["code"]) == (
        404,
        "model",
        "model_not_found",
    )
    assert answer["error"]["message"].endswith(f"serves the model and its LoRA adapters: {SERVED}")


def test_tokenize_takes_the_served_names(named: ServerThread) -> None:
    for model, want in (("alias", 200), ("sql", 200), (named.engine.model_name, 404)):
        status, _ = _call(named.url, "/tokenize", {"model": model, "prompt": "hi"})
        assert status == want, model


def test_health_and_metrics_name_the_first(named: ServerThread) -> None:
    status, health = _call(named.url, "/health")
    assert status == 200 and health["model"] == "gpt-x"
    status, text = _call(named.url, "/metrics")
    assert 'troupe_model_info{model_name="gpt-x"} 1.0' in text.splitlines()
    assert 'troupe_requests_total{model_name="gpt-x",outcome="stop"}' in text  # on every series
    status, page = _call(named.url, "/")
    assert status == 200 and "gpt-x" in page and DEFAULT_MODEL_NAME not in page


def test_without_the_flag_the_engines_id_is_the_model(server: ServerThread) -> None:
    _, text = _call(server.url, "/metrics")
    assert f'troupe_model_info{{model_name="{server.engine.model_name}"}} 1.0' in text
    _, body = _call(server.url, "/v1/models")
    name = server.engine.model_name
    assert [(m["id"], m["root"]) for m in body["data"]] == [(name, name)]


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
async def test_websocket_model_takes_the_served_names(named: ServerThread) -> None:
    frames = {
        "first": {"model": "gpt-x"},
        "alias": {"model": "alias"},
        "adapter": {"model": "sql"},
        "engine-id": {"model": named.engine.model_name},
        "alias-vs-lora": {"model": "alias", "lora": "sql"},
    }
    ends = await _ws_ends(named, frames)
    got = {rid: (end["type"], end.get("field")) for rid, end in ends.items()}
    assert got == {
        "first": ("done", None),
        "alias": ("done", None),
        "adapter": ("done", None),
        "engine-id": ("error", "model"),
        "alias-vs-lora": ("error", "lora"),
    }
    assert ends["engine-id"]["code"] == "model_not_found"
    assert ends["engine-id"]["message"].endswith(SERVED)
    assert "selects the base model 'gpt-x'" in ends["alias-vs-lora"]["message"]


def test_the_router_lists_and_answers_what_the_replica_does(named: ServerThread) -> None:
    settings = RouterSettings(backend_urls=(named.url,), health_check_interval_s=3600.0)
    router = RouterThread().start_router(settings)
    try:
        via = openai_client(router.url)
        assert [m.id for m in via.models.list().data] == ["gpt-x", "alias", "sql", "chat-v2"]
        answer = via.completions.create(model="alias", prompt="SELECT", max_tokens=2)
        assert answer.model == "gpt-x"
    finally:
        router.close()


def test_data_parallel_replicas_get_the_flag() -> None:
    argv = ["--served-model-name", "gpt-x", "alias", "--data-parallel-size", "2", "--port", "8"]
    assert replica_args(argv) == ["--served-model-name", "gpt-x", "alias"]
    ns = build_parser().parse_args(["serve", *argv])
    assert ns.served_model_name == ["gpt-x", "alias"]


def test_run_batch_answers_under_the_served_names(tmp_path: Path) -> None:
    def line(custom_id: str, model: str) -> str:
        body = {"model": model, "prompt": "SELECT", "max_tokens": 2}
        return json.dumps(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}
        )

    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(f"{line('alias', 'alias')}\n{line('engine-id', DEFAULT_MODEL_NAME)}\n")
    args = ["run-batch", "-i", str(source), "-o", str(out), "--no-progress"]
    ns = build_parser().parse_args([*args, "--served-model-name", "gpt-x", "alias"])
    assert run_batch_command(ns, BASE_CONFIG) == 0
    alias, engine_id = (json.loads(x)["response"] for x in out.read_text().splitlines())
    assert (alias["status_code"], alias["body"]["model"]) == (200, "gpt-x")
    assert engine_id["status_code"] == 404
    assert engine_id["body"]["error"]["message"].endswith("serves the model: 'gpt-x', 'alias'")
