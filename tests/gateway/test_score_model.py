"""POST /v1/score and /v1/rerank on the real default model (SmolLM2 on the CPU, the engine in
its child process): each score is the cosine similarity of the two texts' vectors from
/v1/embeddings on the same server (576 floats, last-token pooling), for 1:N and N:N, and a
rerank orders the documents as those cosines do. SmolLM2 is no trained embedding model: what
is checked is that the scores are the vectors' cosines, not that they rank by meaning."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import numpy as np
import pytest

from tests.gateway.conftest import ServerThread

QUERY = "What is the capital of France?"
DOCS = [
    "Paris is the capital and largest city of France.",
    "Bananas are rich in potassium.",
    "The Eiffel Tower stands in Paris.",
]


def _post(url: str, path: str, body: object) -> Any:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def _embedded(smol: ServerThread, texts: list[str]) -> dict[str, np.ndarray]:
    body = _post(smol.url, "/v1/embeddings", {"input": texts})
    return {t: np.array(d["embedding"]) for t, d in zip(texts, body["data"], strict=True)}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_scores_are_the_cosines_of_the_embeddings(smol: ServerThread) -> None:
    vectors = _embedded(smol, [QUERY, *DOCS])
    assert {v.shape for v in vectors.values()} == {(576,)}  # SmolLM2's hidden size
    body = _post(smol.url, "/v1/score", {"text_1": QUERY, "text_2": [*DOCS, QUERY]})
    scores = [d["score"] for d in body["data"]]
    want = [_cosine(vectors[QUERY], vectors[d]) for d in DOCS]
    # the same engine, the same prompts, each run alone: the same vectors, up to float32
    np.testing.assert_allclose(scores[:3], want, rtol=0, atol=1e-6)
    assert scores[3] == pytest.approx(1.0, abs=1e-6)
    assert max(want) - min(want) > 0.01  # the texts differ: a wrong pairing shows
    tokens = sum(len(smol.engine.tokenizer.encode(t)) for t in [QUERY, *DOCS])
    assert body["usage"]["prompt_tokens"] == tokens  # the query ran once

    pairs = _post(smol.url, "/v1/score", {"text_1": DOCS, "text_2": [QUERY, DOCS[2], DOCS[0]]})
    want = [
        _cosine(vectors[DOCS[0]], vectors[QUERY]),
        _cosine(vectors[DOCS[1]], vectors[DOCS[2]]),
        _cosine(vectors[DOCS[2]], vectors[DOCS[0]]),
    ]
    np.testing.assert_allclose([d["score"] for d in pairs["data"]], want, rtol=0, atol=1e-6)


def test_rerank_orders_as_the_cosines_do(smol: ServerThread) -> None:
    vectors = _embedded(smol, [QUERY, *DOCS])
    cosines = [_cosine(vectors[QUERY], vectors[d]) for d in DOCS]
    body = _post(smol.url, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2})
    order = sorted(range(len(DOCS)), key=lambda i: -cosines[i])[:2]
    assert [r["index"] for r in body["results"]] == order
    assert [r["document"]["text"] for r in body["results"]] == [DOCS[i] for i in order]
    np.testing.assert_allclose(
        [r["relevance_score"] for r in body["results"]], [cosines[i] for i in order], atol=1e-6
    )
