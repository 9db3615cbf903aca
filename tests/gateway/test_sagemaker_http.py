"""SageMaker's /ping and /invocations and vLLM's /version: /invocations answers a body as the
endpoint its fields name would (whole and streamed), a body that names none is a 400 naming
`body`; /invocations, /classify and /pooling are behind the API key, /ping and /version not."""

from __future__ import annotations

import importlib.metadata
import json
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from troupe.gateway import openai_routes
from troupe.gateway.classify_routes import classify
from troupe.gateway.embeddings_routes import embeddings
from troupe.gateway.invocation_kind import invocation_kind
from troupe.gateway.pooling_routes import pooling
from troupe.gateway.sagemaker_routes import endpoint
from troupe.gateway.settings import GatewaySettings

from tests.gateway.test_http import read_sse

pytestmark = pytest.mark.anyio

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}


async def _post(url: str, path: str, body: Any, headers: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}{path}", json=body, headers=headers or {}) as resp:
            if resp.content_type == "text/event-stream":
                return resp.status, [json.loads(p) for p in (await read_sse(resp))[:-1]]
            return resp.status, await resp.json()


def _same(answer: dict[str, Any], direct: dict[str, Any]) -> None:
    """The same answer but for what differs between any two calls (ids, times, prefix-cache
    hits)."""
    for body in (answer, direct):
        body.pop("id", None), body.pop("created", None)
        body.get("usage", {}).pop("prompt_tokens_details", None)
    assert answer == direct


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (CHAT, "/v1/chat/completions"),
        (COMPLETION, "/v1/completions"),
        ({"input": ["a", "b"]}, "/v1/embeddings"),
        ({"text_1": "a", "text_2": ["b", "c"]}, "/v1/score"),
        ({"query": "a", "documents": ["b", "c"]}, "/v1/rerank"),
    ],
)
async def test_a_body_runs_as_the_endpoint_it_names(server, body: Any, path: str) -> None:  # type: ignore[no-untyped-def]
    status, answer = await _post(server.url, "/invocations", body)
    assert status == 200, answer
    direct_status, direct = await _post(server.url, path, body)
    assert direct_status == 200
    _same(answer, direct)


async def test_streams_and_errors_are_the_endpoints(server) -> None:  # type: ignore[no-untyped-def]
    status, chunks = await _post(server.url, "/invocations", {**CHAT, "stream": True})
    assert status == 200 and {c["object"] for c in chunks} == {"chat.completion.chunk"}
    status, error = await _post(server.url, "/invocations", {**COMPLETION, "max_tokens": -1})
    assert status == 400 and error["error"]["param"] == "max_tokens", error
    for body in ({"text_1": "a"}, {"model": "x"}, {"messages": None}, [1, 2], "hi"):
        status, error = await _post(server.url, "/invocations", body)
        assert status == 400 and error["error"]["param"] == "body", (body, error)


async def test_ping_and_version(server) -> None:  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/health") as resp:
            health = await resp.json()
        for method in ("GET", "POST"):
            async with http.request(method, f"{server.url}/ping") as resp:
                assert resp.status == 200 and await resp.json() == health
        async with http.get(f"{server.url}/version") as resp:
            assert await resp.json() == {"version": importlib.metadata.version("troupe")}


async def test_work_paths_need_the_key(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(api_key="sesame"))
    for path, body in [("/invocations", CHAT), ("/classify", {"input": "a"}),
                       ("/pooling", {"input": "a"})]:  # fmt: skip
        status, error = await _post(url, path, body)
        assert status == 401 and error["error"]["code"] == "missing_api_key", (path, error)
    status, answer = await _post(url, "/invocations", CHAT, {"Authorization": "Bearer sesame"})
    assert status == 200 and answer["object"] == "chat.completion"
    async with aiohttp.ClientSession() as http:
        for path in ("/ping", "/version"):
            async with http.get(f"{url}{path}") as resp:
                assert resp.status == 200, path


@pytest.mark.parametrize(
    ("labels", "token", "handler"),
    [((), False, embeddings), (("no", "yes"), False, classify), (("O", "B"), True, pooling)],
)
def test_input_goes_where_the_model_serves_it(labels: Any, token: bool, handler: Any) -> None:
    gateway: Any = SimpleNamespace(
        engine=SimpleNamespace(classifier_labels=labels, is_token_classifier=token)
    )
    assert endpoint("input", gateway) is handler
    assert endpoint("chat", gateway) is openai_routes.chat_completions


def test_the_fields_name_the_endpoint_in_vllms_order() -> None:
    def kind(*fields: str) -> Any:
        return invocation_kind(lambda name: name in fields)

    assert kind("messages", "prompt", "input") == "chat"
    assert kind("prompt_embeds", "input") == "completion"
    assert kind("input", "text_1", "text_2") == "input"
    assert kind("text_1", "text_2", "query", "documents") == "score"
    assert kind("text_1", "query", "documents") == "rerank"
    assert kind("text_1") is kind("query") is kind("model") is None
