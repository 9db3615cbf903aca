"""POST /pooling's per-token tasks (vLLM's token_classify, token_embed) against transformers:
a tiny random LlamaForTokenClassification (the engine in its child process) answers each
prompt token's label probabilities, or the logits with `use_activation: false`, as vLLM's
[P, num_labels] rows, float and base64, by default and when named, prompts in chunks; a
prompt pooled twice computed whole; /classify and /v1/embeddings refuse it naming `model`, as
do the tasks it lacks naming `task`; a tiny causal LM's token_embed rows are its final hidden
states (unit norm; raw with `use_activation: false`); the fake runner's rows by shape."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from troupe import EngineConfig
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, post_json
from tests.gpu.conftest import add_word_tokenizer, make_hf_model
from tests.gpu.tiny_classifier import LABELS, hf_hidden, hf_logits, tiny_classifier

TEXTS = ["w1 w2 w3", "w9 w8 w7 w6 w5 w4 w3 w2 w1 w0 w17 w30 w31 w32", "w200"]


def _ids(text: str) -> list[int]:
    return [int(word[1:]) for word in text.split()]


def _config(folder: Path) -> EngineConfig:
    return EngineConfig(
        device="cpu",
        model=str(folder),
        max_model_len=128,
        max_num_seqs=4,
        max_num_batched_tokens=8,  # the long prompt comes in chunks
        enable_prefix_caching=True,
    )


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Any]]:
    folder = Path(tmp_path_factory.mktemp("tagger")) / "model"
    hf_model = tiny_classifier(folder, "llama", seed=5, per_token=True)
    srv = ServerThread(_config(folder), GatewaySettings()).start()
    yield srv, hf_model
    srv.shutdown()


def test_token_classify_rows_equal_transformers(tagger: tuple[ServerThread, Any]) -> None:
    server, hf_model = tagger
    assert server.engine.classifier_labels == tuple(LABELS.values())
    assert server.engine.is_token_classifier
    logits = [hf_logits(hf_model, _ids(text)) for text in TEXTS]
    for body in ({"input": TEXTS}, {"input": TEXTS, "task": "token_classify"}):
        status, answer = post_json(server.url, "/pooling", body)
        assert status == 200, answer
        assert answer["id"].startswith("pool-") and answer["object"] == "list"
        assert [(d["index"], d["object"]) for d in answer["data"]] == [
            (i, "pooling") for i in range(3)
        ]
        for d, want in zip(answer["data"], logits, strict=True):
            got = torch.tensor(d["data"])
            assert got.shape == want.shape  # [P, num_labels]
            assert got == pytest.approx(torch.softmax(want, dim=-1), abs=1e-5)
        num_tokens = sum(len(t.split()) for t in TEXTS)
        assert answer["usage"]["prompt_tokens"] == num_tokens
    status, raw = post_json(server.url, "/pooling", {"input": TEXTS[1], "use_activation": False})
    assert status == 200, raw
    assert torch.tensor(raw["data"][0]["data"]) == pytest.approx(logits[1], abs=1e-4)
    request = {"input": TEXTS[1], "encoding_format": "base64", "use_activation": False}
    status, b64 = post_json(server.url, "/pooling", request)
    assert status == 200, b64
    blob = base64.b64decode(b64["data"][0]["data"])
    flat = struct.unpack(f"<{len(blob) // 4}f", blob)  # the rows one after another, float32
    assert torch.tensor(flat).view(-1, len(LABELS)) == pytest.approx(logits[1], abs=1e-4)


def test_token_classifier_refusals(tagger: tuple[ServerThread, Any]) -> None:
    server, _ = tagger
    for task in ("classify", "embed", "token_embed", "bogus"):
        status, body = post_json(server.url, "/pooling", {"input": "w1", "task": task})
        assert status == 400 and body["error"]["param"] == "task", (task, body)
    _, body = post_json(server.url, "/pooling", {"input": "w1", "task": "classify"})
    assert "token-classification" in body["error"]["message"], body
    for path in ("/classify", "/v1/embeddings"):
        status, body = post_json(server.url, path, {"input": "w1"})
        assert status == 400 and body["error"]["param"] == "model", (path, body)
        assert "token" in body["error"]["message"], body


def test_token_embed_rows_equal_transformers(tmp_path: Path) -> None:
    hf_model = make_hf_model("qwen3", max_position_embeddings=128)
    folder = tmp_path / "lm"
    hf_model.save_pretrained(folder)
    add_word_tokenizer(folder)
    server = ServerThread(_config(folder), GatewaySettings()).start()
    try:
        hidden = [hf_hidden(hf_model, _ids(text)) for text in TEXTS]
        _, first = post_json(server.url, "/pooling", {"input": TEXTS})  # embed, its blocks cached
        assert [len(d["data"]) for d in first["data"]] == [64] * 3, first
        status, body = post_json(server.url, "/pooling", {"input": TEXTS, "task": "token_embed"})
        assert status == 200, body
        for d, want in zip(body["data"], hidden, strict=True):
            unit = torch.nn.functional.normalize(want, dim=-1)
            assert torch.tensor(d["data"]) == pytest.approx(unit, abs=1e-5)
        request = {"input": TEXTS[1], "task": "token_embed", "use_activation": False}
        status, raw = post_json(server.url, "/pooling", request)
        assert status == 200, raw
        assert torch.tensor(raw["data"][0]["data"]) == pytest.approx(hidden[1], abs=1e-4)
        status, body = post_json(server.url, "/pooling", {"input": "w1", "task": "token_classify"})
        assert status == 400 and body["error"]["param"] == "task", body
    finally:
        server.shutdown()


def test_fake_runner_token_embed_shape(server: ServerThread) -> None:
    status, body = post_json(
        server.url, "/pooling", {"input": ["a b c", "d"], "task": "token_embed"}
    )
    assert status == 200, body
    tokens = body["usage"]["prompt_tokens"]
    rows = [d["data"] for d in body["data"]]
    assert sum(len(r) for r in rows) == tokens and all(len(v) == 8 for r in rows for v in r)
    assert rows[0][0] != rows[0][-1]
