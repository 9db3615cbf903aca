"""POST /pooling (vLLM's generic pooling endpoint) on an embedding model (the fake runner's
made-up vectors, the shared server) and on a tiny random one-label reward model
(LlamaForSequenceClassification, num_labels 1, no problem_type: Skywork-Reward's shape, the
engine in its child process) against transformers: vLLM's answer shape, each input's `data`
the model's own endpoint's vector (/v1/embeddings' embedding, /classify's probs), float and
base64, a reward model's score the sigmoid of its logit (vLLM's activation for one label) and
the raw logit with `use_activation: false`, through /classify alike; its token_classify rows
(the head on every token); `task` naming another task and bad inputs refused by name; a
run-batch JSON call; the router."""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from troupe import EngineConfig
from troupe.gateway.json_calls import answer
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, post_json
from tests.gateway.router_harness import RouterThread
from tests.gpu.tiny_classifier import hf_hidden, hf_logits, tiny_classifier

INPUTS = ["Once upon a time", "The weather today is", "A"]
TEXTS = ["w1 w2 w3", "w9 w8 w7 w6 w5 w4 w3 w2 w1 w0 w17", "w200"]


def _floats(b64: str) -> list[float]:
    raw = base64.b64decode(b64)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))  # little-endian float32


def _f32(vector: list[float]) -> list[float]:
    return list(struct.unpack(f"<{len(vector)}f", struct.pack(f"<{len(vector)}f", *vector)))


def _ids(text: str) -> list[int]:
    return [int(word[1:]) for word in text.split()]


@pytest.fixture(scope="module")
def reward(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Any]]:
    folder = Path(tmp_path_factory.mktemp("reward")) / "model"
    hf_model = tiny_classifier(folder, "llama", seed=3, labels={})
    assert hf_model.config.num_labels == 1 and hf_model.config.problem_type is None
    config = EngineConfig(device="cpu", model=str(folder), max_model_len=128, max_num_seqs=4)
    srv = ServerThread(config, GatewaySettings()).start()
    yield srv, hf_model
    srv.shutdown()


def test_embedding_model_answers_its_embeddings(server: ServerThread) -> None:
    model = server.engine.model_name
    status, body = post_json(server.url, "/pooling", {"model": model, "input": INPUTS})
    assert status == 200, body
    assert body["object"] == "list" and body["id"].startswith("pool-")
    assert body["model"] == model and isinstance(body["created"], int)
    assert [(d["index"], d["object"]) for d in body["data"]] == [(i, "pooling") for i in range(3)]
    status, want = post_json(server.url, "/v1/embeddings", {"input": INPUTS})
    assert status == 200, want
    vectors = [d["embedding"] for d in want["data"]]
    assert [d["data"] for d in body["data"]] == vectors and len({tuple(v) for v in vectors}) == 3
    num_tokens = want["usage"]["prompt_tokens"]
    assert body["usage"] == {
        "prompt_tokens": num_tokens,
        "total_tokens": num_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    request = {"input": INPUTS, "task": "embed", "encoding_format": "base64"}
    status, b64 = post_json(server.url, "/pooling", request)
    assert status == 200, b64
    assert [_floats(d["data"]) for d in b64["data"]] == [_f32(v) for v in vectors]
    status, raw = post_json(server.url, "/pooling", {"input": INPUTS[0], "use_activation": False})
    status_e, raw_e = post_json(
        server.url, "/v1/embeddings", {"input": INPUTS[0], "normalize": False}
    )
    assert (status, status_e) == (200, 200), (raw, raw_e)
    assert raw["data"][0]["data"] == raw_e["data"][0]["embedding"] != vectors[0]


def test_embedding_model_refusals_name_the_field(server: ServerThread) -> None:
    cases = [
        ({"input": "a", "task": "classify"}, "task"),
        ({"input": "a", "task": "token_classify"}, "task"),
        ({"input": "a", "task": "bogus"}, "task"),
        ({"input": "a", "dimensions": 4}, "dimensions"),
        ({"input": ""}, "input"),
        ({"input": ["a", ""]}, "input[1]"),
        ({"input": []}, "input"),
        ({"input": "a", "encoding_format": "bytes"}, "encoding_format"),
        ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": "a", "normalize": True, "use_activation": False}, "use_activation"),
        ({"input": "a", "messages": []}, "messages"),
    ]
    for request, field in cases:
        status, body = post_json(server.url, "/pooling", request)
        assert status == 400 and body["error"]["param"] == field, (request, body)
    status, body = post_json(server.url, "/pooling", {"input": "a", "task": "classify"})
    assert "embedding model" in body["error"]["message"], body


def test_a_run_batch_call_and_the_router(server: ServerThread) -> None:
    raw = json.dumps({"input": INPUTS[:2]}).encode()
    got = server.call(answer(server.gateway, "/pooling", raw))
    status, direct = post_json(server.url, "/pooling", {"input": INPUTS[:2]})
    assert got.status == status == 200, got
    assert json.loads(json.dumps(got.body["data"])) == direct["data"]  # tuples as the wire has
    bad = server.call(answer(server.gateway, "/pooling", b'{"input": "a", "task": "x"}'))
    assert bad.status == 400 and bad.error["param"] == "task", bad
    settings = RouterSettings(backend_urls=(server.url,), health_check_interval_s=3600.0)
    router = RouterThread().start_router(settings)
    try:
        status, via = post_json(router.url, "/pooling", {"input": INPUTS[:2]})
        assert status == 200 and via["data"] == direct["data"], via
        status, body = post_json(router.url, "/pooling", {"input": "a", "dimensions": 2})
        assert status == 400 and body["error"]["param"] == "dimensions", body  # the replica's
    finally:
        router.close()


def test_reward_model_scores(reward: tuple[ServerThread, Any]) -> None:
    server, hf_model = reward
    assert server.engine.classifier_labels == ("LABEL_0",)
    logits = [float(hf_logits(hf_model, _ids(text))[0]) for text in TEXTS]
    sigmoids = [1 / (1 + math.exp(-x)) for x in logits]
    assert len({round(x, 3) for x in logits}) == 3  # distinct: the order is checked
    status, body = post_json(server.url, "/pooling", {"input": TEXTS})
    assert status == 200, body
    assert [d["data"] for d in body["data"]] == [[pytest.approx(s, abs=1e-5)] for s in sigmoids]
    status, body = post_json(server.url, "/pooling", {"input": TEXTS, "use_activation": False})
    assert status == 200, body
    assert [d["data"] for d in body["data"]] == [[pytest.approx(x, abs=1e-4)] for x in logits]
    num_tokens = sum(len(t.split()) for t in TEXTS)
    assert body["usage"]["prompt_tokens"] == num_tokens
    status, body = post_json(server.url, "/classify", {"input": TEXTS, "use_activation": False})
    assert status == 200, body
    assert [d["probs"] for d in body["data"]] == [[pytest.approx(x, abs=1e-4)] for x in logits]
    assert [(d["label"], d["num_classes"]) for d in body["data"]] == [("LABEL_0", 1)] * 3
    status, body = post_json(server.url, "/classify", {"input": TEXTS[0]})
    assert status == 200 and body["data"][0]["probs"] == [pytest.approx(sigmoids[0], abs=1e-5)]


def test_reward_model_ids_base64_truncation_and_refusals(reward: tuple[ServerThread, Any]) -> None:
    server, hf_model = reward
    ids = _ids(TEXTS[1])
    request = {
        "input": ids,
        "task": "classify",
        "use_activation": False,
        "encoding_format": "base64",
    }
    status, body = post_json(server.url, "/pooling", request)
    assert status == 200, body
    want = float(hf_logits(hf_model, ids)[0])
    assert _floats(body["data"][0]["data"]) == [pytest.approx(want, abs=1e-4)]
    request = {"input": ids, "truncate_prompt_tokens": 3, "softmax": False}
    status, body = post_json(server.url, "/pooling", request)
    assert status == 200, body
    want = float(hf_logits(hf_model, ids[-3:])[0])  # the last 3 tokens kept
    assert body["data"][0]["data"] == [pytest.approx(want, abs=1e-4)]
    assert body["usage"]["prompt_tokens"] == 3
    status, body = post_json(server.url, "/pooling", {"input": "w1", "task": "embed"})
    assert status == 400 and body["error"]["param"] == "task", body
    assert "classification model" in body["error"]["message"]
    status, body = post_json(server.url, "/pooling", {"input": ["w1", "w3 " * 130]})
    assert status == 400 and body["error"]["param"] == "input[1]", body


def test_reward_model_token_classify(reward: tuple[ServerThread, Any]) -> None:
    """A sequence classifier serves token_classify too (vLLM's): its head on every token,
    sigmoid for one label; truncation keeps the last tokens' rows."""
    server, hf_model = reward
    ids = _ids(TEXTS[1])
    with torch.no_grad():
        want = hf_model.score(hf_hidden(hf_model, ids))  # [P, 1]
    status, body = post_json(server.url, "/pooling", {"input": ids, "task": "token_classify"})
    assert status == 200, body
    assert torch.tensor(body["data"][0]["data"]) == pytest.approx(torch.sigmoid(want), abs=1e-5)
    request = {"input": ids, "task": "token_classify", "use_activation": False}
    status, body = post_json(server.url, "/pooling", request)
    assert status == 200, body
    assert torch.tensor(body["data"][0]["data"]) == pytest.approx(want, abs=1e-4)
    request = {"input": ids, "task": "token_classify", "truncate_prompt_tokens": 3}
    status, body = post_json(server.url, "/pooling", request)
    assert status == 200, body
    with torch.no_grad():
        cut = torch.sigmoid(hf_model.score(hf_hidden(hf_model, ids[-3:])))
    assert torch.tensor(body["data"][0]["data"]) == pytest.approx(cut, abs=1e-5)
