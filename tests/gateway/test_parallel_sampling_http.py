"""n and best_of over HTTP with the official `openai` client: choices indexed, streamed and
not, best_of > n on completions, and the errors naming their field."""

from __future__ import annotations

import json
from collections import defaultdict

import openai
import pytest
from openai import OpenAI
from troupe.gpu.fake_runner import EOS_SEED_BASE
from troupe.messages import SamplingParams

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _alone(server, prompt, seed: int, max_tokens: int) -> str:  # type: ignore[no-untyped-def]
    """The text the engine gives the request run alone with that seed."""

    async def run() -> str:
        params = SamplingParams(max_tokens=max_tokens, seed=seed, ignore_eos=True)
        return "".join([e.text async for e in server.engine.generate(prompt, params)])

    return str(server.call(run()))


def test_completions_n3_whole_and_streamed(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model, extra = server.engine.model_name, {"ignore_eos": True}
    expected = [_alone(server, PROMPT, 40 + i, 6) for i in range(3)]
    out = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, n=3, seed=40, extra_body=extra
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == expected
    assert out.usage is not None and out.usage.completion_tokens == 18

    chunks = list(
        client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=6,
            n=3,
            seed=40,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    )
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                finishes[choice.index].append(choice.finish_reason)
    assert [texts[i] for i in range(3)] == expected
    assert dict(finishes) == {0: ["length"], 1: ["length"], 2: ["length"]}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 18


def test_chat_n3_whole_and_streamed(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model, extra = server.engine.model_name, {"ignore_eos": True}
    messages = [{"role": "user", "content": "Tell me a story"}]
    out = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=5,
        n=3,
        seed=7,
        extra_body=extra,  # type: ignore[arg-type]
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    whole = [c.message.content for c in out.choices]
    assert len(set(whole)) == 3  # three seeds, three texts

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=5,
        n=3,
        seed=7,
        stream=True,
        extra_body=extra,  # type: ignore[arg-type]
    )
    texts: dict[int, str] = defaultdict(str)
    roles: set[int] = set()
    ends: dict[int, int] = defaultdict(int)
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.role == "assistant":
                roles.add(choice.index)
            texts[choice.index] += choice.delta.content or ""
            ends[choice.index] += choice.finish_reason is not None
    assert roles == {0, 1, 2} and dict(ends) == {0: 1, 1: 1, 2: 1}
    assert [texts[i] for i in range(3)] == whole


def test_best_of_returns_the_n_best(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    # Sample i of seed EOS_SEED_BASE + 2 + i stops after 2 + i tokens: the shorter, the higher
    # its summed logprob, so the two best are samples 0 and 1.
    model = server.engine.model_name
    out = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=20, n=2, best_of=4, seed=EOS_SEED_BASE + 2
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.finish_reason for c in out.choices] == ["stop", "stop"]
    assert out.choices[0].logprobs is None  # the ranking's logprobs are not the client's
    assert out.usage is not None and out.usage.completion_tokens == 2 + 3


@pytest.mark.parametrize(
    ("kind", "kw", "param"),
    [
        ("completions", {"n": 2, "best_of": 1}, "best_of"),
        ("completions", {"n": 17}, "n"),  # over max_num_samples (16)
        ("chat", {"n": 17}, "n"),
        ("completions", {"n": 0}, "n"),
        ("completions", {"n": 1, "best_of": 3, "stream": True}, "best_of"),
    ],
)
def test_errors_name_the_field(client: OpenAI, server, kind: str, kw: dict, param: str) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    with pytest.raises(openai.BadRequestError) as info:
        if kind == "chat":
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **kw
            )
        else:
            client.completions.create(model=model, prompt="hi", max_tokens=2, **kw)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param, info.value.body  # type: ignore[index]


def test_greedy_n_is_allowed(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    out = client.completions.create(
        model=server.engine.model_name, prompt=PROMPT, max_tokens=4, n=2, temperature=0
    )
    assert len(out.choices) == 2 and out.choices[0].text == out.choices[1].text


def test_websocket_frames_refuse_several_samples_by_name() -> None:
    from troupe.gateway.ws_requests import FrameError, parse_frame

    for extra, field in (({"n": 2}, "n"), ({"best_of": 3}, "best_of")):
        frame = {"type": "generate", "request_id": "w", "prompt": "hi", **extra}
        error = parse_frame(json.dumps(frame))
        assert isinstance(error, FrameError) and error.field == field, error
