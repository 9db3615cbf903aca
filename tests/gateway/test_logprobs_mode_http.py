"""EngineConfig.logprobs_mode reaches the OpenAI answers: with processed_logprobs and top_k 2,
each generated token's two kept alternatives hold all the probability (they sum to 1, where
the raw distribution's two best hold less) and the dropped ones come back at vLLM's -9999
floor (JSON has no -inf), on completions and on streamed chat. A tiny random Qwen3 on the CPU
with a word tokenizer."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from troupe.config import EngineConfig
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread

PROMPT = [5, 17, 42, 99, 3, 250, 7]
FLOOR = -9999.0


@pytest.fixture(scope="module")
def processed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    from tests.gpu.conftest import add_word_tokenizer, make_hf_model

    folder = tmp_path_factory.mktemp("qwen3")
    make_hf_model("qwen3").save_pretrained(folder)
    add_word_tokenizer(folder)
    config = EngineConfig(
        device="cpu",
        model=str(folder),
        dtype="float32",
        block_size=4,
        num_kv_blocks=64,
        max_model_len=128,
        gc_freeze=False,
        logprobs_mode="processed_logprobs",
        chat_template="{% for m in messages %}{{ m['content'] }} {% endfor %}",  # words only
    )
    srv = ServerThread(config, GatewaySettings()).start()
    yield srv
    srv.shutdown()


def _post(srv: ServerThread, path: str, body: dict[str, Any]) -> str:
    data = json.dumps({"model": srv.engine.model_name, **body}).encode()
    request = urllib.request.Request(
        f"{srv.url}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return str(response.read().decode())
    except urllib.error.HTTPError as exc:
        raise AssertionError(exc.read().decode()) from None


def _check_kept_two(values: list[float]) -> None:
    """Five values (the chosen token and the top 4, or the top 4 when the chosen is among
    them): top_k 2 kept two, which hold all the mass; the others are floored."""
    kept = sorted((v for v in values if v > FLOOR), reverse=True)
    assert len(kept) == 2, values
    assert math.exp(kept[0]) + math.exp(kept[1]) == pytest.approx(1.0, abs=1e-4)
    assert values.count(FLOOR) == len(values) - 2


def test_processed_logprobs_over_http(processed: ServerThread) -> None:
    sampling = {"max_tokens": 4, "temperature": 1.0, "top_k": 2, "seed": 3}
    answer = json.loads(
        _post(processed, "/v1/completions", {"prompt": PROMPT, "logprobs": 4, **sampling})
    )
    logprobs = answer["choices"][0]["logprobs"]
    assert len(logprobs["top_logprobs"]) == 4
    for chosen, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True):
        assert chosen > FLOOR and chosen in top.values()
        _check_kept_two(list(top.values()))

    messages = [{"role": "user", "content": "w5 w17 w42"}]
    body = {"messages": messages, "logprobs": True, "top_logprobs": 4, "stream": True}
    sse = _post(processed, "/v1/chat/completions", {**body, **sampling})
    raw = [f.removeprefix("data: ") for f in sse.split("\n\n") if f]
    assert raw[-1] == "[DONE]"
    entries = [
        entry
        for frame in map(json.loads, raw[:-1])
        for choice in frame["choices"]
        for entry in (choice.get("logprobs") or {}).get("content") or ()
    ]
    assert len(entries) == 4
    for entry in entries:
        top = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(top) == 4 and entry["logprob"] in top
        _check_kept_two(top)
