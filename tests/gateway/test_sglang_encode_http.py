"""SGLang's POST /encode on the fake runner (its made-up vectors): a text, a list of texts, or
token ids give the vectors /v1/embeddings gives for the same inputs, in SGLang's shape (one
object, or a list), with each input's prompt tokens and rid; errors name the field the client
wrote (`text[1]`, not `input[1]`); the router passes it to a replica."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from troupe.gateway.router_settings import RouterSettings

from tests.gateway.conftest import ServerThread
from tests.gateway.router_harness import RouterThread

TEXTS = ["a cat sat", "on the mat", "the dog barked twice"]


def _post(url: str, body: Any) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _embeddings(server: ServerThread, given: Any) -> Any:
    status, body = _post(f"{server.url}/v1/embeddings", {"input": given})
    assert status == 200, body
    return body


def test_vectors_as_embeddings_gives_them(server: ServerThread) -> None:
    expected = _embeddings(server, TEXTS)
    status, rows = _post(f"{server.url}/encode", {"text": TEXTS, "rid": ["r0", "r1", "r2"]})
    assert status == 200 and isinstance(rows, list), rows
    assert [r["embedding"] for r in rows] == [d["embedding"] for d in expected["data"]]
    assert [r["meta_info"]["id"] for r in rows] == ["r0", "r1", "r2"]
    counts = [r["meta_info"]["prompt_tokens"] for r in rows]
    assert sum(counts) == expected["usage"]["prompt_tokens"] and min(counts) > 0
    assert all(r["meta_info"]["completion_tokens"] == 0 for r in rows)

    status, one = _post(f"{server.url}/encode", {"text": TEXTS[1]})
    assert status == 200 and isinstance(one, dict), one
    assert one["embedding"] == expected["data"][1]["embedding"]
    assert one["meta_info"]["id"] and one["meta_info"]["e2e_latency"] >= 0

    ids = [[5, 6, 7], [8, 9]]
    status, by_ids = _post(f"{server.url}/encode", {"input_ids": ids})
    assert status == 200
    assert [r["embedding"] for r in by_ids] == [
        d["embedding"] for d in _embeddings(server, ids)["data"]
    ]
    assert [r["meta_info"]["prompt_tokens"] for r in by_ids] == [3, 2]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text": ["a", ""]}, "text[1]"),
        ({"text": ""}, "text"),
        ({"input_ids": []}, "input_ids"),
        ({"text": "a", "input_ids": [1]}, "text"),
        ({}, "text"),
        ({"text": ["a", "b"], "rid": ["x"]}, "rid"),
        ({"text": "a", "image_data": "x"}, "image_data"),
    ],
)
def test_errors_name_the_clients_field(server: ServerThread, body: Any, field: str) -> None:
    status, answer = _post(f"{server.url}/encode", body)
    assert status == 400 and answer["error"]["param"] == field, answer
    assert "input" not in answer["error"]["message"].replace("input_ids", ""), answer


def test_an_unknown_adapter_is_a_404(server: ServerThread) -> None:
    status, answer = _post(f"{server.url}/encode", {"text": "a", "lora_path": "nope"})
    assert status == 404, answer


def test_through_the_router(server: ServerThread) -> None:
    settings = RouterSettings(backend_urls=(server.url,), health_check_interval_s=3600.0)
    router = RouterThread().start_router(settings)
    try:
        direct = _post(f"{server.url}/encode", {"text": TEXTS[0]})
        assert (
            _post(f"{router.url}/encode", {"text": TEXTS[0]})[1]["embedding"]
            == (direct[1]["embedding"])
        )
    finally:
        router.close()
