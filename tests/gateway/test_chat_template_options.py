"""vLLM's chat-template extras on /v1/chat/completions and /tokenize, driven by the official
`openai` client: `add_generation_prompt`, `continue_final_message` and `chat_template_kwargs`
reach the template (the prompt the engine ran is the one /tokenize and the tokenizer render),
`echo` leads the answer with the last turn, bad combinations are a 400 naming the field, and
the options cross the engine-process boundary intact."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
from openai import OpenAI
from troupe.gateway.engine_process import _prompt_of
from troupe.messages import ChatMessage, ChatPrompt, GenerateRequest, SamplingParams

OPEN_TURN = [
    {"role": "user", "content": "Name a prime"},
    {"role": "assistant", "content": "The smallest prime is"},
]


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _tokenize(server, body: dict[str, Any]) -> tuple[int, Any]:  # type: ignore[no-untyped-def]
    request = urllib.request.Request(
        f"{server.url}/tokenize",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_continue_final_message_runs_the_open_turn(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    tokenizer = server.engine.tokenizer
    options = {"add_generation_prompt": False, "continue_final_message": True}
    rendered = tokenizer.render_chat(OPEN_TURN, **options)
    assert rendered.endswith("The smallest prime is")
    want = tokenizer.encode(rendered, False)
    status, tokens = _tokenize(server, {"messages": OPEN_TURN, **options})
    assert status == 200 and tokens["tokens"] == want
    out = client.chat.completions.create(
        model=server.engine.model_name,
        messages=OPEN_TURN,  # type: ignore[arg-type]
        max_tokens=3,
        extra_body=options,
    )
    assert out.usage is not None and out.usage.prompt_tokens == len(want)
    # the default answers the last turn: a closed assistant turn and a new one opened
    default = client.chat.completions.create(
        model=server.engine.model_name,
        messages=OPEN_TURN,  # type: ignore[arg-type]
        max_tokens=3,
    )
    assert default.usage is not None and default.usage.prompt_tokens > len(want)


def test_chat_template_kwargs_are_accepted(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    out = client.chat.completions.create(
        model=server.engine.model_name,
        messages=OPEN_TURN[:1],  # type: ignore[arg-type]
        max_tokens=2,
        extra_body={"chat_template_kwargs": {"enable_thinking": False, "documents": None}},
    )
    assert out.choices[0].finish_reason in ("stop", "length")


def test_echo_leads_each_answer_with_the_last_turn(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    """vLLM's chat echo: the last message's content leads every choice (streamed as the first
    content chunk) where its role is the answer's; a user's last turn is not echoed."""
    options = {"add_generation_prompt": False, "continue_final_message": True}
    kw: dict[str, Any] = {"model": server.engine.model_name, "max_tokens": 3, "temperature": 0}
    plain = client.chat.completions.create(messages=OPEN_TURN, extra_body=options, **kw)  # type: ignore[arg-type]
    echoed = client.chat.completions.create(
        messages=OPEN_TURN,  # type: ignore[arg-type]
        n=2,
        extra_body={**options, "echo": True},
        **kw,
    )
    answer = plain.choices[0].message.content
    assert (
        answer
        and [c.message.content for c in echoed.choices] == ["The smallest prime is" + answer] * 2
    )
    chunks = client.chat.completions.create(
        messages=OPEN_TURN,  # type: ignore[arg-type]
        stream=True,
        extra_body={**options, "echo": True},
        **kw,
    )
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert (
        deltas[0] == "The smallest prime is"
        and "".join(deltas) == echoed.choices[0].message.content
    )
    question = OPEN_TURN[:1]
    user_last = [
        client.chat.completions.create(messages=question, extra_body=extra, **kw)  # type: ignore[arg-type]
        for extra in ({}, {"echo": True})
    ]
    assert user_last[0].choices[0].message.content == user_last[1].choices[0].message.content


def test_echo_with_tools_is_refused_by_name(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=server.engine.model_name,
            messages=OPEN_TURN[:1],  # type: ignore[arg-type]
            tools=[tool],  # type: ignore[list-item]
            tool_choice="required",
            extra_body={"echo": True},
        )
    assert info.value.body["param"] == "echo", info.value.body  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"continue_final_message": True}, "continue_final_message"),  # generation prompt on
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"add_generation_prompt": True}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
    ],
)
def test_bad_options_name_their_field(client: OpenAI, server, extra: dict, param: str) -> None:  # type: ignore[no-untyped-def, type-arg]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=server.engine.model_name,
            messages=OPEN_TURN,  # type: ignore[arg-type]
            max_tokens=2,
            extra_body=extra,
        )
    assert info.value.body["param"] == param, info.value.body  # type: ignore[index]
    status, body = _tokenize(server, {"messages": OPEN_TURN, **extra})
    assert status == 400 and body["error"]["param"] == param, body


def test_tokenize_refuses_chat_options_without_messages(server) -> None:  # type: ignore[no-untyped-def]
    for name, value in (("continue_final_message", True), ("chat_template_kwargs", {"a": 1})):
        status, body = _tokenize(server, {"prompt": "x", name: value})
        assert status == 400 and body["error"]["param"] == name, body


def test_options_cross_the_engine_process_boundary() -> None:
    request = GenerateRequest(
        request_id="r",
        params=SamplingParams(),
        arrival_time=0.0,
        messages=(ChatMessage(role="user", content="hi"),),
        add_generation_prompt=False,
        continue_final_message=True,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert _prompt_of(request) == ChatPrompt(
        messages=request.messages or (),
        add_generation_prompt=False,
        continue_final_message=True,
        template_kwargs={"enable_thinking": False},
    )


def test_websocket_frames_carry_the_template_options() -> None:
    """A websocket frame with "messages" takes the same options and becomes the ChatPrompt the
    chat endpoint makes (the engine edge checks it as for HTTP); with "prompt" they are an
    error naming the option, and a wrong type names it too."""
    from troupe.gateway.ws_requests import FrameError, Generate, parse_frame

    base = {"type": "generate", "request_id": "r", "messages": OPEN_TURN, "max_tokens": 3}
    plain = parse_frame(json.dumps(base))
    assert isinstance(plain, Generate)
    assert plain.prompt == [ChatMessage(**m) for m in OPEN_TURN]
    options = {
        "add_generation_prompt": False,
        "continue_final_message": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    got = parse_frame(json.dumps({**base, **options}))
    assert isinstance(got, Generate)
    assert got.prompt == ChatPrompt(
        messages=tuple(ChatMessage(**m) for m in OPEN_TURN),
        add_generation_prompt=False,
        continue_final_message=True,
        template_kwargs={"enable_thinking": False},
    )
    assert got.params.max_tokens == 3
    bad = parse_frame(json.dumps({**base, "continue_final_message": "yes"}))
    assert isinstance(bad, FrameError) and bad.field == "continue_final_message"
    text = {"type": "generate", "request_id": "r", "prompt": "x", "add_generation_prompt": False}
    wrong = parse_frame(json.dumps(text))
    assert isinstance(wrong, FrameError) and wrong.field == "add_generation_prompt"
    assert "messages" in wrong.message
