"""vLLM's return_token_ids on /v1/completions and /v1/chat/completions (fake runner, the real
SmolLM2 tokenizer): the prompt's ids are the ones /tokenize gives, each answer's ids decode to
its text, a stream's ids add up to the whole answer's, and the combinations not served are a
400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.gateway.test_http import read_sse

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "Name a prime"}]


async def _post(server: Any, route: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}{route}", json=body) as resp:
            if body.get("stream"):
                payloads = await read_sse(resp)
                assert payloads[-1] == "[DONE]"
                return resp.status, [json.loads(p) for p in payloads[:-1]]
            return resp.status, await resp.json()


async def test_completions_carry_the_prompt_and_answer_ids(server) -> None:  # type: ignore[no-untyped-def]
    tokenizer = server.engine.tokenizer
    body = {"prompt": ["Hello world", "The sky"], "max_tokens": 6, "temperature": 0}
    status, whole = await _post(server, "/v1/completions", {**body, "return_token_ids": True})
    assert status == 200
    tokenized_first: list[int] = []
    for prompt, choice in zip(body["prompt"], whole["choices"], strict=True):
        _, tokenized = await _post(server, "/tokenize", {"prompt": prompt})
        assert choice["prompt_token_ids"] == tokenized["tokens"]
        tokenized_first = tokenized_first or tokenized["tokens"]
        assert tokenizer.decode(choice["token_ids"], True) == choice["text"]
    assert sum(len(c["token_ids"]) for c in whole["choices"]) == whole["usage"]["completion_tokens"]
    cut = {**body, "prompt": "Hello world", "truncate_prompt_tokens": 1, "return_token_ids": True}
    _, truncated = await _post(server, "/v1/completions", cut)  # the ids the engine ran
    assert truncated["choices"][0]["prompt_token_ids"] == tokenized_first[-1:]
    _, plain = await _post(server, "/v1/completions", body)
    assert all("token_ids" not in c and "prompt_token_ids" not in c for c in plain["choices"])

    one = {**body, "prompt": "Hello world", "return_token_ids": True}
    status, chunks = await _post(server, "/v1/completions", {**one, "stream": True})
    assert status == 200
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[0]["prompt_token_ids"] == whole["choices"][0]["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in choices[1:])
    assert [t for c in choices for t in c["token_ids"]] == whole["choices"][0]["token_ids"]


async def test_chat_carries_the_prompt_on_the_response_and_each_choices_ids(server) -> None:  # type: ignore[no-untyped-def]
    tokenizer = server.engine.tokenizer
    body = {"messages": CHAT, "max_tokens": 6, "return_token_ids": True, "n": 2, "seed": 3}
    status, whole = await _post(server, "/v1/chat/completions", body)
    assert status == 200
    _, tokenized = await _post(server, "/tokenize", {"messages": CHAT})
    assert whole["prompt_token_ids"] == tokenized["tokens"]
    assert len(whole["choices"]) == 2
    for choice in whole["choices"]:
        assert tokenizer.decode(choice["token_ids"], True) == choice["message"]["content"]

    status, chunks = await _post(server, "/v1/chat/completions", {**body, "stream": True})
    assert status == 200
    assert chunks[0]["prompt_token_ids"] == tokenized["tokens"]  # the first chunk: the role's
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    for index, choice in enumerate(whole["choices"]):
        streamed = [
            t
            for c in chunks
            for one in c["choices"]
            if one["index"] == index
            for t in one.get("token_ids", ())
        ]
        assert streamed == choice["token_ids"]


@pytest.mark.parametrize(
    ("route", "extra"),
    [
        ("/v1/completions", {"prompt": "Hi", "echo": True}),
        ("/v1/completions", {"prompt": "Hi", "use_beam_search": True, "n": 2}),
        (
            "/v1/chat/completions",
            {
                "messages": CHAT,
                "stream": True,
                "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            },
        ),
    ],
)
async def test_combinations_not_served_name_the_field(
    server, route: str, extra: dict[str, Any]
) -> None:  # type: ignore[no-untyped-def]
    body = {**extra, "max_tokens": 3, "return_token_ids": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}{route}", json=body) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
    assert error["param"] == "return_token_ids" and "cannot be combined" in error["message"]
