"""logit_bias, min_tokens and seed on the real default model (SmolLM2 on the CPU), through the
official `openai` client: the fake model has no logits, so these need real ones."""

from __future__ import annotations

import pytest
from openai import OpenAI

from tests.gateway.conftest import ServerThread

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(smol: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{smol.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _greedy_ids(smol: ServerThread, client: OpenAI, n: int, **extra: object) -> list[int]:
    out = client.completions.create(
        model=smol.engine.model_name,
        prompt=PROMPT,
        max_tokens=n,
        temperature=0,
        extra_body={"ignore_eos": True, **extra},
    )
    return list(smol.engine.tokenizer.encode(out.choices[0].text, False))


def test_logit_bias_steers_greedy_decoding(smol: ServerThread, client: OpenAI) -> None:
    tokenizer = smol.engine.tokenizer
    (paris,) = tokenizer.encode(" Paris", False)
    (banana,) = tokenizer.encode(" banana", False)
    assert _greedy_ids(smol, client, 1)[0] == paris
    banned = client.completions.create(
        model=smol.engine.model_name,
        prompt=PROMPT,
        max_tokens=1,
        temperature=0,
        logit_bias={str(paris): -100},
    )
    assert banned.choices[0].text != " Paris"
    chat = client.chat.completions.create(
        model=smol.engine.model_name,
        messages=[{"role": "user", "content": "Name a fruit."}],
        max_tokens=3,
        temperature=0,
        logit_bias={str(banana): 100},
    )
    assert chat.choices[0].message.content == " banana" * 3


def test_min_tokens_masks_stop_token_ids(smol: ServerThread, client: OpenAI) -> None:
    """The greedy first token is made a stop token: it ends the request at once, unless
    min_tokens masks it (then another token comes first and the request runs on)."""
    first = _greedy_ids(smol, client, 1)[0]
    model = smol.engine.model_name
    stopped = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        extra_body={"stop_token_ids": [first]},
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage is not None and stopped.usage.completion_tokens == 1
    held = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        extra_body={"stop_token_ids": [first], "min_tokens": 2, "ignore_eos": True},
    )
    assert held.usage is not None and held.usage.completion_tokens >= 2
    ids = list(smol.engine.tokenizer.encode(held.choices[0].text, False))
    assert ids[0] != first


def test_seed_is_honoured(smol: ServerThread, client: OpenAI) -> None:
    def text(seed: int) -> str:
        out = client.completions.create(
            model=smol.engine.model_name,
            prompt="Once upon a time",
            max_tokens=8,
            temperature=1.5,
            seed=seed,
            extra_body={"ignore_eos": True},
        )
        return out.choices[0].text

    assert text(3) == text(3)
    assert text(3) != text(4)
