"""The official `openai` client against the gateway: completions and chat, streamed and not."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam
from troupe.messages import SamplingParams


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _expected_text(server, prompt: str, max_tokens: int) -> str:  # type: ignore[no-untyped-def]
    """What the engine itself says for the prompt (greedy; the fake model is deterministic)."""

    async def run() -> str:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return "".join([e.text async for e in server.engine.generate(prompt, params)])

    return str(server.call(run()))


def test_models(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    models = client.models.list().data
    assert [m.id for m in models] == [server.engine.model_name]
    assert client.models.retrieve(server.engine.model_name) == models[0]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("org/not-served")  # a slash in the id is part of it
    error = info.value.body
    assert isinstance(error, dict) and (error["param"], error["code"]) == (
        "model",
        "model_not_found",
    )
    assert "'org/not-served' does not exist" in error["message"]


def test_completion_whole_and_streamed(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    expected = _expected_text(server, "The capital of France is", 8)
    out = client.completions.create(
        model=model,
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.object == "text_completion" and out.model == model
    assert out.choices[0].text == expected
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8

    chunks = list(
        client.completions.create(
            model=model,
            prompt="The capital of France is",
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_logprobs(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    out = client.completions.create(
        model=server.engine.model_name,
        prompt="Once upon a time",
        max_tokens=5,
        temperature=0,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert len(logprobs.tokens) == 5 and "".join(logprobs.tokens) == out.choices[0].text
    assert logprobs.token_logprobs is not None and all(lp <= 0.0 for lp in logprobs.token_logprobs)
    assert logprobs.top_logprobs is not None
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)


def test_chat_whole_and_streamed(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hi."}]
    expected = _expected_text_chat(server, messages, 6)
    out = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == expected
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 6

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_completion_tokens=6,
        temperature=0,
        stream=True,
        logprobs=True,
        top_logprobs=1,
        extra_body={"ignore_eos": True},
    )
    chunks: list[ChatCompletionChunk] = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"
    tokens = [
        lp.token
        for c in chunks
        if c.choices[0].logprobs
        for lp in c.choices[0].logprobs.content or []
    ]
    assert len(tokens) == 6 and "".join(tokens) == expected


def _expected_text_chat(server, messages: list[ChatCompletionMessageParam], max_tokens: int) -> str:  # type: ignore[no-untyped-def]
    async def run() -> str:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return "".join([e.text async for e in server.engine.generate(messages, params)])

    return str(server.call(run()))
