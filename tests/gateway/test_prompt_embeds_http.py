"""Completions' `prompt_embeds` (vLLM's --enable-prompt-embeds) over HTTP, with the engine in
its child process (the rows cross the process boundary): the real default model's token
embeddings of a prompt, base64 of torch.save, answer what the prompt's ids answer, alone and
beside a text prompt (embeddings first, as vLLM orders them); every refusal names its field;
every block comes back."""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from troupe.config import EngineConfig, default_model_path
from troupe.gateway.state import GatewaySettings
from troupe.gpu.weights import load_model

from tests.gateway.conftest import ServerThread

TEXT = "The theatre troupe arrived in town and"
CONFIG = EngineConfig(
    device="cpu",
    max_model_len=64,
    num_kv_blocks=32,
    max_num_seqs=4,
    quantization="dequantize",
    enable_prompt_embeds=True,
    gc_freeze=False,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedder() -> Any:
    """The model's own embedding table (fp32, dequantized as the engine's)."""
    _, model = load_model(
        default_model_path(), torch.float32, torch.device("cpu"), 64, quantization="dequantize"
    )
    return model


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerThread]:
    server = ServerThread(CONFIG, GatewaySettings()).start()
    yield server
    server.shutdown()


def saved(tensor: torch.Tensor) -> str:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def rows_of(srv: ServerThread, embedder: Any, text: str) -> tuple[list[int], torch.Tensor]:
    ids = srv.engine.tokenizer.encode(text, True)
    with torch.no_grad():
        return ids, embedder.embed(torch.tensor(ids))


GREEDY = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}


def test_token_embeddings_answer_as_the_ids(srv: ServerThread, embedder: Any) -> None:
    ids, rows = rows_of(srv, embedder, TEXT)
    status, by_ids = post(srv.url, {"prompt": ids, **GREEDY})
    assert status == 200
    status, by_rows = post(srv.url, {"prompt_embeds": saved(rows), **GREEDY})
    assert status == 200, by_rows
    assert by_rows["choices"][0]["text"] == by_ids["choices"][0]["text"]
    assert by_rows["usage"]["prompt_tokens"] == len(ids)
    # both fields: the embeddings' choice first, then the text's (vLLM's order); a bf16 tensor
    _, other_rows = rows_of(srv, embedder, "Three primary colors are")
    status, both = post(
        srv.url,
        {"prompt_embeds": [saved(other_rows.bfloat16())], "prompt": TEXT, **GREEDY},
    )
    assert status == 200, both
    texts = [c["text"] for c in sorted(both["choices"], key=lambda c: c["index"])]
    assert texts[1] == by_ids["choices"][0]["text"]
    _, by_other = post(srv.url, {"prompt_embeds": saved(other_rows.bfloat16()), **GREEDY})
    assert texts[0] == by_other["choices"][0]["text"]
    srv.wait_idle()
    assert srv.engine.stats().num_gpu_blocks_used == 0


def deflated(tensor: torch.Tensor) -> str:
    """torch.save's archive with its members compressed: a few KB that decode to megabytes."""
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as src,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for member in src.infolist():
            dst.writestr(member.filename, src.read(member))
    return base64.b64encode(out.getvalue()).decode()


def test_refusals_name_their_field(srv: ServerThread, embedder: Any) -> None:
    _, rows = rows_of(srv, embedder, TEXT)
    good = saved(rows)
    cases: list[tuple[dict[str, Any], int, str, str]] = [
        ({"prompt_embeds": "not base64!"}, 400, "prompt_embeds", "base64"),
        ({"prompt_embeds": saved(torch.arange(6).reshape(2, 3))}, 400, "prompt_embeds", "float"),
        ({"prompt_embeds": saved(torch.randn(4))}, 400, "prompt_embeds", "rank 2"),
        ({"prompt_embeds": saved(torch.randn(3, 7))}, 400, "prompt_embeds", "hidden_size"),
        ({"prompt_embeds": saved(torch.randn(64, 576))}, 400, "prompt_embeds", "max_model_len"),
        ({"prompt_embeds": deflated(torch.zeros(2048, 576))}, 413, "prompt_embeds", "max_body"),
        ({"prompt_embeds": [good, "x"]}, 400, "prompt_embeds[1]", "base64"),
        ({"prompt_embeds": good, "echo": True}, 400, "echo", "prompt_embeds"),
        ({"prompt_embeds": good, "prompt_logprobs": 1}, 400, "prompt_logprobs", "prompt_embeds"),
        ({"prompt_embeds": good, "repetition_penalty": 1.2}, 400, "repetition_penalty", "prompt"),
        ({"prompt_embeds": []}, 400, "prompt_embeds", "empty"),
        ({"max_tokens": 4}, 400, "prompt", "prompt_embeds"),
    ]
    for body, status, field, fragment in cases:
        got, answer = post(srv.url, {"max_tokens": 4, **body})
        assert got == status, (body.keys(), answer)
        error = answer["error"]
        assert error["param"] == field, error
        assert fragment in error["message"], error
    srv.wait_idle()
    assert srv.engine.stats().num_gpu_blocks_used == 0


def test_refused_when_the_flag_is_off(server: ServerThread) -> None:
    """The shared fake-runner server was started without enable_prompt_embeds."""
    status, answer = post(server.url, {"prompt_embeds": saved(torch.randn(3, 8)), "max_tokens": 2})
    assert status == 400
    assert answer["error"]["param"] == "prompt_embeds"
    assert "--enable-prompt-embeds" in answer["error"]["message"]
