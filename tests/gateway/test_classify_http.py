"""POST /classify and /v1/classify on a tiny random Qwen3ForSequenceClassification (the
engine in its child process, labels from its Hello) against transformers: vLLM's answer shape,
probabilities and the label of the largest, logits with use_activation false, usage; a
completion to the classifier refused naming `model`; bad inputs refused by name; the router
proxies both paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from troupe import EngineConfig
from troupe.gateway.router_app import PROXIED
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, post_json
from tests.gpu.tiny_classifier import LABELS, hf_logits, tiny_classifier

TEXTS = ["w1 w2 w3", "w9 w8 w7 w6 w5 w4 w3 w2 w1 w0 w17", "w200"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Any]]:
    folder = Path(tmp_path_factory.mktemp("clf")) / "model"
    hf_model = tiny_classifier(folder, "qwen3")
    config = EngineConfig(device="cpu", model=str(folder), max_model_len=128, max_num_seqs=4)
    srv = ServerThread(config, GatewaySettings()).start()
    yield srv, hf_model
    srv.shutdown()


def _ids(text: str) -> list[int]:
    return [int(word[1:]) for word in text.split()]


@pytest.mark.parametrize("path", ["/classify", "/v1/classify"])
def test_answer_in_vllms_shape(classifier: tuple[ServerThread, Any], path: str) -> None:
    server, hf_model = classifier
    status, body = post_json(server.url, path, {"model": server.engine.model_name, "input": TEXTS})
    assert status == 200, body
    assert body["object"] == "list" and body["id"].startswith("classify-")
    assert body["model"] == server.engine.model_name and isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    for text, item in zip(TEXTS, body["data"], strict=True):
        want = torch.softmax(hf_logits(hf_model, _ids(text)), dim=-1)
        assert item["num_classes"] == 3
        assert torch.tensor(item["probs"]) == pytest.approx(want, abs=1e-5)
        assert item["label"] == LABELS[int(want.argmax())]
    num_tokens = sum(len(t.split()) for t in TEXTS)
    assert body["usage"] == {
        "prompt_tokens": num_tokens,
        "total_tokens": num_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }


def test_token_ids_and_logits(classifier: tuple[ServerThread, Any]) -> None:
    server, hf_model = classifier
    ids = _ids(TEXTS[1])
    status, body = post_json(server.url, "/classify", {"input": ids, "use_activation": False})
    assert status == 200, body
    [item] = body["data"]
    want = hf_logits(hf_model, ids)
    assert torch.tensor(item["probs"]) == pytest.approx(want, abs=1e-4)
    assert item["label"] == LABELS[int(want.argmax())]
    status, body = post_json(server.url, "/classify", {"input": ids, "truncate_prompt_tokens": 3})
    assert status == 200, body
    want = torch.softmax(hf_logits(hf_model, ids[-3:]), dim=-1)  # the last 3 tokens kept
    assert torch.tensor(body["data"][0]["probs"]) == pytest.approx(want, abs=1e-5)
    assert body["usage"]["prompt_tokens"] == 3


def test_refusals_name_the_field(classifier: tuple[ServerThread, Any]) -> None:
    server, _ = classifier
    status, body = post_json(server.url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 2})
    assert status == 400 and body["error"]["param"] == "model", body
    assert "classif" in body["error"]["message"]
    cases = [
        ({"input": ""}, "input"),
        ({"input": ["w1", ""]}, "input[1]"),
        ({"input": []}, "input"),
        ({"input": "w1", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": "w1", "use_activation": True, "softmax": False}, "use_activation"),
        ({"input": "w1", "dimensions": 2}, "dimensions"),
    ]
    for request, field in cases:
        status, body = post_json(server.url, "/classify", request)
        assert status == 400 and body["error"]["param"] == field, (request, body)
    status, body = post_json(server.url, "/classify", {"input": ["w1", "w3 " * 130]})
    assert status == 400 and body["error"]["param"] == "input[1]", body


def test_a_classifier_of_several_labels_cannot_score(classifier: tuple[ServerThread, Any]) -> None:
    server, _ = classifier
    status, body = post_json(server.url, "/v1/score", {"text_1": "w1", "text_2": ["w2", "w3"]})
    assert status == 400 and body["error"]["param"] == "model", body
    assert "3 labels" in body["error"]["message"] and "cross-encoder" in body["error"]["message"]


def test_the_router_proxies_both_paths() -> None:
    assert "/classify" in PROXIED and "/v1/classify" in PROXIED
