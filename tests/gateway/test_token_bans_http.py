"""allowed_token_ids, bad_words and truncate_prompt_tokens on both OpenAI endpoints and in
websocket frames, against the fake-runner gateway (its model moves a forbidden token to the
next allowed one: gpu/fake_model.held_back), and the 400s that name each field."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import OpenAI
from troupe.actors.core.tokenizer_params import bad_words_token_ids
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import SamplingParams
from websockets.asyncio.client import connect

PROMPT = "Hi there, how are you doing today?"
N = 6


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _prompt_ids(server: Any, chat: bool) -> list[int]:
    tok = server.engine.tokenizer
    if not chat:
        return list(tok.encode(PROMPT, True))
    rendered = tok.render_chat([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    return list(tok.encode(rendered, False))


def _create(client: OpenAI, server: Any, chat: bool, **extra: Any) -> Any:
    model = server.engine.model_name
    body = {"ignore_eos": True, **extra}
    if chat:
        messages = [{"role": "user", "content": PROMPT}]
        return client.chat.completions.create(
            model=model, messages=messages, max_tokens=N, seed=1, extra_body=body
        )
    return client.completions.create(
        model=model, prompt=PROMPT, max_tokens=N, seed=1, extra_body=body
    )


def _text(out: Any) -> str:
    choice = out.choices[0]
    return str(choice.message.content if hasattr(choice, "message") else choice.text)


def _expected(server: Any, chat: bool, params: SamplingParams) -> list[int]:
    return FakeRunner.reference_tokens(_prompt_ids(server, chat), N, params)


@pytest.mark.parametrize("chat", [False, True])
def test_allowed_token_ids_hold_on_both_endpoints(client: OpenAI, server, chat: bool) -> None:  # type: ignore[no-untyped-def]
    base = _expected(server, chat, SamplingParams(max_tokens=N, seed=1))
    allowed = [t for t in (1000, 1500, 2500) if t not in base]
    params = SamplingParams(max_tokens=N, seed=1, allowed_token_ids=tuple(allowed))
    expected = _expected(server, chat, params)
    assert set(expected) <= set(allowed) and expected != base
    out = _create(client, server, chat, allowed_token_ids=allowed)
    assert _text(out) == server.engine.tokenizer.decode(expected)


@pytest.mark.parametrize("chat", [False, True])
def test_bad_words_hold_on_both_endpoints(client: OpenAI, server, chat: bool) -> None:  # type: ignore[no-untyped-def]
    tok = server.engine.tokenizer
    base = _expected(server, chat, SamplingParams(max_tokens=N, seed=1))
    # a word whose encoding ends with a token greedy writes (not its first one)
    words = [(w, bad_words_token_ids(tok, [w])) for w in (tok.decode([t]).strip() for t in base)]
    word, ids = next(
        (w, ids)
        for k, (w, ids) in enumerate(words)
        if k and w and any(i[-1] == base[k] for i in ids)
    )
    params = SamplingParams(max_tokens=N, seed=1, bad_words_token_ids=ids)
    expected = _expected(server, chat, params)
    assert expected != base
    out = _create(client, server, chat, bad_words=[word])
    assert _text(out) == tok.decode(expected)


@pytest.mark.parametrize("chat", [False, True])
def test_truncate_prompt_tokens_counts_what_ran(client: OpenAI, server, chat: bool) -> None:  # type: ignore[no-untyped-def]
    ids = _prompt_ids(server, chat)
    out = _create(client, server, chat, truncate_prompt_tokens=2)
    assert out.usage is not None and out.usage.prompt_tokens == 2
    expected = FakeRunner.reference_tokens(ids[-2:], N, SamplingParams(seed=1))
    assert len(ids) > 2
    assert _text(out) == server.engine.tokenizer.decode(expected)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": [10**8]}, "allowed_token_ids"),
        ({"allowed_token_ids": list(range(1025))}, "allowed_token_ids"),
        ({"bad_words": ["  "]}, "bad_words"),
        ({"bad_words": ["w"] * 129}, "bad_words"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens"),
        (
            {
                "allowed_token_ids": [5],
                "ignore_eos": False,
                "response_format": {"type": "json_object"},
            },
            "allowed_token_ids",
        ),
        ({"bad_words": ["x"], "use_beam_search": True}, "bad_words"),
    ],
)
def test_refusals_name_their_field(
    client: OpenAI,
    server,  # type: ignore[no-untyped-def]
    chat: bool,
    extra: dict[str, Any],
    param: str,
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _create(client, server, chat, **extra)
    body = info.value.body
    assert isinstance(body, dict) and body.get("param") == param, body


def test_frames_take_the_fields() -> None:
    from troupe.gateway.ws_requests import FrameError, Generate, parse_frame

    frame = {"type": "generate", "request_id": "r", "prompt": "x", "max_tokens": 4}
    extras = {"allowed_token_ids": [7, 9], "bad_words": ["no"], "truncate_prompt_tokens": 3}
    ok = parse_frame(json.dumps({**frame, **extras}))
    assert isinstance(ok, Generate)
    assert ok.params.allowed_token_ids == (7, 9) and ok.params.bad_words == ("no",)
    assert ok.params.truncate_prompt_tokens == 3
    for extra, field in (
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"bad_words": [""]}, "bad_words"),
        ({"truncate_prompt_tokens": -3}, "truncate_prompt_tokens"),
        ({"bad_words_token_ids": [[5]]}, "bad_words_token_ids"),
    ):
        bad = parse_frame(json.dumps({**frame, **extra}))
        assert isinstance(bad, FrameError) and bad.field == field, bad


@pytest.mark.anyio
async def test_a_websocket_request_keeps_to_the_set(server) -> None:  # type: ignore[no-untyped-def]
    ids = _prompt_ids(server, False)
    allowed = [1000, 1500, 2500]
    frame = {
        "type": "generate",
        "request_id": "r1",
        "prompt": PROMPT,
        "max_tokens": N,
        "seed": 1,
        "ignore_eos": True,
        "allowed_token_ids": allowed,
        "truncate_prompt_tokens": 3,
    }
    url = str(server.url).replace("http://", "ws://") + "/v1/ws"
    async with connect(url) as ws:
        await ws.send(json.dumps(frame))
        frames = []
        while not frames or frames[-1]["type"] not in ("done", "error"):
            frames.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({**frame, "request_id": "r2", "truncate_prompt_tokens": 10**6}))
        refused = json.loads(await ws.recv())
    params = SamplingParams(max_tokens=N, seed=1, allowed_token_ids=tuple(allowed))
    got = [t for f in frames for t in f.get("token_ids", ())]
    assert got == FakeRunner.reference_tokens(ids[-3:], N, params)
    assert frames[-1]["type"] == "done" and frames[-1]["usage"]["prompt_tokens"] == 3
    assert refused["type"] == "error" and refused.get("field", refused.get("param")) in (
        "truncate_prompt_tokens",
    ), refused
