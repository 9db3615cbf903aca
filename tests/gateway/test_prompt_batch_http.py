"""Completions with a list of prompts over HTTP, driven by the official `openai` client: one
request per prompt, choices numbered prompt-major, each equal to its prompt run alone, usage
summed per prompt; a prompt the engine turns away fails the request, naming it, and leaves
nothing running."""

from __future__ import annotations

from collections import defaultdict

import openai
import pytest
from openai import OpenAI
from troupe.gateway.state import GatewaySettings
from troupe.messages import SamplingParams

PROMPTS = ["Once upon a time", "The weather today is"]


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _alone(server, prompt, seed: int, max_tokens: int) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """The text the engine gives the prompt run alone with that seed, and its prompt tokens."""

    async def run() -> tuple[str, int]:
        params = SamplingParams(max_tokens=max_tokens, seed=seed, ignore_eos=True)
        text, prompt_tokens = [], 0
        async for event in server.engine.generate(prompt, params):
            text.append(event.text)
            prompt_tokens = getattr(event, "usage", None) and event.usage.prompt_tokens
        return "".join(text), prompt_tokens

    return server.call(run())  # type: ignore[no-any-return]


def test_prompt_list_whole_and_streamed(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model, extra = server.engine.model_name, {"ignore_eos": True}
    alone = [_alone(server, p, 30 + j, 5) for p in PROMPTS for j in range(2)]
    expected = [text for text, _ in alone]
    prompt_tokens = alone[0][1] + alone[2][1]
    out = client.completions.create(
        model=model, prompt=PROMPTS, max_tokens=5, n=2, seed=30, extra_body=extra
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert [c.text for c in out.choices] == expected
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (prompt_tokens, 20)

    stream = client.completions.create(
        model=model,
        prompt=PROMPTS,
        max_tokens=5,
        n=2,
        seed=30,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, int] = defaultdict(int)
    chunks = list(stream)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finishes[choice.index] += choice.finish_reason is not None
    assert [texts[i] for i in range(4)] == expected
    assert dict(finishes) == {0: 1, 1: 1, 2: 1, 3: 1}
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (
        prompt_tokens,
        20,
    )
    server.wait_idle(20.0)


def test_prompt_list_echo_and_token_ids(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    ids = server.engine.tokenizer.encode(PROMPTS[1])
    out = client.completions.create(
        model=model, prompt=[[int(t) for t in ids], PROMPTS[0]], max_tokens=3, echo=True, seed=5
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].text.startswith(server.engine.tokenizer.decode(ids, False))
    assert out.choices[1].text.startswith(PROMPTS[0])
    assert len(out.choices[1].text) > len(PROMPTS[0])


def test_a_refused_prompt_fails_the_request_by_name(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    too_long = [7] * (server.engine.max_model_len + 1)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            out = client.completions.create(
                model=model, prompt=[[5, 6, 7], too_long], max_tokens=4, stream=stream
            )
            list(out) if stream else None  # type: ignore[call-overload]
        assert info.value.body["param"] == "prompt[1]", info.value.body  # type: ignore[index]
        assert "prompt[1]" in info.value.body["message"]  # type: ignore[index]
    server.wait_idle(20.0)  # the first prompt's request was aborted: no block, no stream left


@pytest.mark.parametrize(
    "prompt",
    [[], ["a", 5], [[1, 2], 3]],
)
def test_malformed_prompt_lists_are_400(client: OpenAI, server, prompt: list) -> None:  # type: ignore[no-untyped-def, type-arg]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.engine.model_name, prompt=prompt, max_tokens=2)
    assert info.value.body["param"] == "prompt", info.value.body  # type: ignore[index]


def test_prompts_per_request_are_bounded(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(max_prompts_per_request=2))
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    model = server.engine.model_name
    assert len(client.completions.create(model=model, prompt=["a", "b"], max_tokens=1).choices) == 2
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt=["a", "b", "c"], max_tokens=1)
    assert info.value.body["param"] == "prompt", info.value.body  # type: ignore[index]
    assert "at most 2 prompts" in info.value.body["message"]  # type: ignore[index]
