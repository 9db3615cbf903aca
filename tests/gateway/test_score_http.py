"""POST /v1/score and /v1/rerank on the fake runner (its made-up 8-float vectors): each score is
the cosine similarity of the two texts' vectors from /v1/embeddings on the same server, for
1:1, 1:N and N:N; each distinct text runs once; rerank order, top_n, return_documents and the
Jina/Cohere paths; a refused text named where the client gave it, nothing left running; the API
key on the paths outside /v1/; a LoRA adapter; a vanished client aborting every text; the
router. The real model's vectors: test_score_model.py."""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.router_harness import RouterThread
from tests.gateway.scripted_runner import ParamsRecorder

QUERY = "hello there"
DOCS = ["good bye", "The weather today is", "hello there", "Once upon a time"]


def _post(url: str, path: str, body: object, headers: dict[str, str] | None = None) -> Any:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        f"{url}{path}", data, {"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _vectors(url: str, texts: list[str]) -> dict[str, list[float]]:
    status, body = _post(url, "/v1/embeddings", {"input": texts})
    assert status == 200, body
    return {t: d["embedding"] for t, d in zip(texts, body["data"], strict=True)}


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a)) / math.sqrt(sum(y * y for y in b))


def _prompt_tokens(server: ServerThread, texts: list[str]) -> int:
    return sum(len(server.engine.tokenizer.encode(t)) for t in texts)


def test_one_against_many_is_the_cosine_of_the_embeddings(server: ServerThread) -> None:
    vectors = _vectors(server.url, [QUERY, *DOCS])
    status, body = _post(server.url, "/v1/score", {"text_1": QUERY, "text_2": DOCS})
    assert status == 200, body
    assert body["object"] == "list" and body["id"].startswith("score-")
    assert body["model"] == server.engine.model_name and isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert [d["object"] for d in body["data"]] == ["score"] * 4
    scores = [d["score"] for d in body["data"]]
    want = [_cosine(vectors[QUERY], vectors[d]) for d in DOCS]
    assert scores == pytest.approx(want, abs=1e-12)
    assert len({round(s, 6) for s in scores}) == 4  # distinct: the order is checked
    assert scores[2] == pytest.approx(1.0, abs=1e-12)  # the query against itself
    # QUERY is also DOCS[2]: four distinct texts ran, each once
    num_tokens = _prompt_tokens(server, [QUERY, *DOCS[:2], DOCS[3]])
    assert body["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}


def test_one_to_one_and_n_to_n(server: ServerThread) -> None:
    vectors = _vectors(server.url, DOCS)
    status, body = _post(server.url, "/score", {"text_1": DOCS[0], "text_2": DOCS[1]})
    assert status == 200, body
    assert [d["score"] for d in body["data"]] == [
        pytest.approx(_cosine(vectors[DOCS[0]], vectors[DOCS[1]]), abs=1e-12)
    ]
    pairs = {"text_1": DOCS[:2], "text_2": DOCS[2:]}
    status, body = _post(server.url, "/v1/score", pairs)
    assert status == 200, body
    want = [_cosine(vectors[a], vectors[b]) for a, b in zip(DOCS[:2], DOCS[2:], strict=True)]
    assert [d["score"] for d in body["data"]] == pytest.approx(want, abs=1e-12)
    status, swapped = _post(server.url, "/v1/score", {"text_1": DOCS[:2], "text_2": DOCS[3:1:-1]})
    assert [d["score"] for d in swapped["data"]] != [d["score"] for d in body["data"]]


def test_each_distinct_text_runs_once(server: ServerThread) -> None:
    before = _ended(server.url, "length")  # one generated token: each text ends by length
    pairs = {"text_1": ["a", "b", "a"], "text_2": ["b", "a", "a"]}
    status, body = _post(server.url, "/v1/score", pairs)
    assert status == 200 and len(body["data"]) == 3, body
    assert _ended(server.url, "length") == before + 2  # "a" and "b": two engine requests


def _ended(url: str, outcome: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return _counted(text, outcome)


def _counted(metrics: str, outcome: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("troupe_requests_total{") and f'outcome="{outcome}"' in line:
            return float(line.split()[-1])
    return 0.0


async def _aborted(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(f"{url}/metrics") as resp:
        return _counted(await resp.text(), "aborted")


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_orders_by_score(server: ServerThread, path: str) -> None:
    vectors = _vectors(server.url, [QUERY, *DOCS])
    documents = [DOCS[0], {"text": DOCS[1]}, DOCS[2], DOCS[3]]  # Jina's objects or strings
    status, body = _post(server.url, path, {"query": QUERY, "documents": documents})
    assert status == 200, body
    assert body["id"].startswith("rerank-") and body["model"] == server.engine.model_name
    want = sorted(
        ((_cosine(vectors[QUERY], vectors[d]), i) for i, d in enumerate(DOCS)), reverse=True
    )
    assert [r["index"] for r in body["results"]] == [i for _, i in want]
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
        [s for s, _ in want], abs=1e-12
    )
    assert [r["document"] for r in body["results"]] == [{"text": DOCS[i]} for _, i in want]
    num_tokens = _prompt_tokens(server, [QUERY, *DOCS[:2], DOCS[3]])
    assert body["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}


def test_rerank_top_n_and_return_documents(server: ServerThread) -> None:
    status, full = _post(server.url, "/v1/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200, full
    status, top = _post(server.url, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2})
    assert status == 200 and top["results"] == full["results"][:2], top
    bare = {"query": QUERY, "documents": DOCS, "top_n": 3, "return_documents": False}
    status, body = _post(server.url, "/v1/rerank", bare)
    assert status == 200, body
    assert [set(r) for r in body["results"]] == [{"index", "relevance_score"}] * 3
    assert [r["index"] for r in body["results"]] == [r["index"] for r in full["results"][:3]]
    assert body["usage"] == full["usage"]  # every document still ran


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
        ("/v1/score", {"text_1": "a", "text_2": ["c", ""]}, "text_2[1]"),
        ("/v1/score", {"text_1": "a", "text_2": "b", "use_activation": True}, "use_activation"),
        ("/v1/rerank", {"query": "", "documents": ["a"]}, "query"),
        ("/v2/rerank", {"query": "q", "documents": []}, "documents"),
        ("/rerank", {"query": "q", "documents": ["a"], "top_n": -2}, "top_n"),
    ],
)
def test_bad_bodies_are_400(server: ServerThread, path: str, body: Any, param: str) -> None:
    status, answer = _post(server.url, path, body)
    assert status == 400 and answer["error"]["param"] == param, answer


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/score", {"text_1": "a", "text_2": "b"}),
        ("/v1/rerank", {"query": "a", "documents": ["b"]}),
    ],
)
def test_unknown_model_is_404(server: ServerThread, path: str, body: dict[str, Any]) -> None:
    status, answer = _post(server.url, path, {**body, "model": "nope"})
    assert status == 404 and answer["error"]["code"] == "model_not_found", answer


def test_a_refused_text_fails_the_request_by_name(server: ServerThread) -> None:
    too_long = " a" * (server.engine.max_model_len + 1)
    status, body = _post(server.url, "/v1/score", {"text_1": "q", "text_2": ["b", too_long, "c"]})
    assert status == 400 and body["error"]["param"] == "text_2[1]", body
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"].startswith("text_2[1]: ")
    status, body = _post(server.url, "/v1/rerank", {"query": too_long, "documents": ["b", "c"]})
    assert status == 400 and body["error"]["param"] == "query", body
    status, body = _post(server.url, "/v1/score", {"text_1": "q", "text_2": too_long})
    assert status == 400 and body["error"]["param"] == "text_2", body  # one text: still named
    server.wait_idle(20.0)  # the other texts' requests were aborted: nothing left running


def test_truncate_prompt_tokens_keeps_each_texts_tail(server: ServerThread) -> None:
    body = {
        "text_1": "one two three",
        "text_2": ["four five six", "seven"],
        "truncate_prompt_tokens": 2,
    }
    status, answer = _post(server.url, "/v1/score", body)
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens"] == 2 + 2 + len(server.engine.tokenizer.encode("seven"))


def test_texts_per_request_are_bounded(server: ServerThread) -> None:
    url = server.add_gateway(GatewaySettings(max_embedding_inputs=3))
    assert _post(url, "/v1/score", {"text_1": "q", "text_2": ["a", "b"]})[0] == 200
    status, body = _post(url, "/v1/score", {"text_1": "q", "text_2": ["a", "b", "c"]})
    assert status == 400 and body["error"]["param"] == "text_2", body
    assert "at most 3 texts" in body["error"]["message"]
    assert "--max-embedding-inputs" in body["error"]["message"]
    status, body = _post(url, "/v1/rerank", {"query": "q", "documents": ["a", "b", "c"]})
    assert status == 400 and body["error"]["param"] == "documents", body


@pytest.mark.parametrize("path", ["/score", "/rerank", "/v2/rerank", "/v1/score"])
def test_api_key_applies_outside_v1_too(server: ServerThread, path: str) -> None:
    url = server.add_gateway(GatewaySettings(api_key="sesame"))
    body = {"text_1": "a", "text_2": "b"} if "score" in path else {"query": "a", "documents": ["b"]}
    status, answer = _post(url, path, body)
    assert status == 401 and answer["error"]["code"] == "missing_api_key", answer
    assert _post(url, path, body, {"Authorization": "Bearer wrong"})[0] == 401
    assert _post(url, path, body, {"Authorization": "Bearer sesame"})[0] == 200


ADAPTERS = {"sql": "/adapters/sql"}
LORA_CONFIG = BASE_CONFIG.replace(lora_modules=("sql=/adapters/sql",))


@pytest.fixture(scope="module")
def recorded() -> Iterator[ServerThread]:
    """The engine in this process around a ParamsRecorder (`srv.runner`), with an adapter."""
    runner = ParamsRecorder(FakeRunner.from_config(LORA_CONFIG))
    srv = ServerThread(LORA_CONFIG, GatewaySettings(), runner=runner)
    yield srv.start()
    srv.shutdown()


def test_an_adapter_runs_every_text(recorded: ServerThread) -> None:
    recorded.runner.take()
    status, body = _post(
        recorded.url, "/v1/rerank", {"model": "sql", "query": "q", "documents": ["a", "b"]}
    )
    assert status == 200 and body["model"] == "sql", body
    params = recorded.runner.take("rerank-")
    assert [p.lora for p in params] == ["sql"] * 3
    assert all(p.pooling is not None and p.max_tokens == 1 for p in params)
    status, body = _post(recorded.url, "/v1/score", {"model": "nope", "text_1": "a", "text_2": "b"})
    assert status == 404 and "'sql'" in body["error"]["message"], body


@pytest.mark.anyio
async def test_vanished_client_aborts_every_text(make_server) -> None:  # type: ignore[no-untyped-def]
    """The runner holds the first step, so no text can finish before the hang-up: all three
    texts are in the engine at once (run concurrently), and all three are aborted."""
    runner = FaultyRunner(FakeRunner.from_config(BASE_CONFIG))
    server = make_server(BASE_CONFIG, runner=runner)
    runner.hold_after(0)
    async with aiohttp.ClientSession() as http:
        before = await _aborted(http, server.url)
        body = {"text_1": "q", "text_2": ["a", "b", "q"]}
        task = asyncio.create_task(http.post(f"{server.url}/v1/score", json=body))
        assert await asyncio.to_thread(runner.wait_until_held, 120)  # a hang guard only
        async with asyncio.timeout(120):  # a hang guard only
            while server.engine.num_active != 3:  # every text's stream open at once
                await asyncio.sleep(0.01)
        task.cancel()  # closes the connection mid-request
        await asyncio.gather(task, return_exceptions=True)
        async with asyncio.timeout(120):  # a hang guard only
            while await _aborted(http, server.url) != before + 3:
                await asyncio.sleep(0.01)
        runner.release()
        await asyncio.to_thread(server.wait_idle)
        assert await _aborted(http, server.url) == before + 3


def test_through_the_router(server: ServerThread) -> None:
    settings = RouterSettings(backend_urls=(server.url,), health_check_interval_s=3600.0)
    router = RouterThread().start_router(settings)
    try:
        score = {"text_1": QUERY, "text_2": DOCS}
        rerank = {"query": QUERY, "documents": DOCS, "top_n": 2}
        for path, body in [
            ("/v1/score", score),
            ("/score", score),
            ("/v1/rerank", rerank),
            ("/rerank", rerank),
            ("/v2/rerank", rerank),
        ]:
            status, via = _post(router.url, path, body)
            assert status == 200, (path, via)
            direct = _post(server.url, path, body)[1]
            key = "data" if "score" in path else "results"
            assert via[key] == direct[key] and via["usage"] == direct["usage"], path
        status, error = _post(router.url, "/v2/rerank", {"query": "q", "documents": []})
        assert status == 400 and error["error"]["param"] == "documents"  # the replica's 400
    finally:
        router.close()
