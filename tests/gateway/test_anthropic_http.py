"""POST /v1/messages with the official `anthropic` client against the fake-runner server: the
answer is chat's (same prompt, text and token counts as /v1/chat/completions, whole and
streamed), the objects parse as the client's own models, the stream's events come in
Anthropic's order and build the whole answer in the client's stream helper, stop_sequences and
max_tokens give their stop reasons, a final assistant turn is continued, count_tokens counts
the prompt, and bad requests are Anthropic's error objects naming the field."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from anthropic import Anthropic
from anthropic.types import Message
from openai import OpenAI
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, openai_client

HI = [{"role": "user", "content": "Hello there"}]
GREEDY = {"temperature": 0}  # not in the newest SDK's arguments; the API takes it


@pytest.fixture(scope="module")
def client(server: ServerThread) -> Anthropic:
    return Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def chat(server: ServerThread) -> OpenAI:
    return openai_client(server.url, timeout=60)


def _chat(chat: OpenAI, messages: list[dict[str, Any]], max_tokens: int, **kw: Any) -> Any:
    return chat.chat.completions.create(
        model="",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0,
        **kw,
    )


def test_text_is_chats_answer_and_parses_as_a_message(
    client: Anthropic, chat: OpenAI, server: ServerThread
) -> None:
    expected = _chat(chat, HI, 8)
    raw = client.messages.with_raw_response.create(
        model="",
        messages=HI,
        max_tokens=8,
        extra_body=GREEDY,  # type: ignore[arg-type]
    )
    body = raw.http_response.json()
    out = Message.model_validate(body)
    assert out.id.startswith("msg_") and out.type == "message" and out.role == "assistant"
    assert out.model == server.engine.model_name
    assert [b.type for b in out.content] == ["text"]
    assert out.content[0].text == expected.choices[0].message.content  # type: ignore[union-attr]
    reason = {"length": "max_tokens", "stop": "end_turn"}[expected.choices[0].finish_reason]
    assert out.stop_reason == reason and out.stop_sequence is None
    assert expected.usage is not None
    cached = body["usage"]["cache_read_input_tokens"]
    assert out.usage.input_tokens + cached == expected.usage.prompt_tokens
    assert out.usage.output_tokens == expected.usage.completion_tokens


def test_the_stream_builds_the_same_answer(client: Anthropic) -> None:
    args: dict[str, Any] = {"model": "", "messages": HI, "max_tokens": 12, "extra_body": GREEDY}
    whole = client.messages.create(**args)
    events = list(client.messages.create(stream=True, **args))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert len(deltas) >= 2
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * len(deltas),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]
    assert start.type == "message_start" and start.message.content == []
    assert start.message.id != whole.id and start.message.stop_reason is None
    assert start.message.usage.input_tokens == (
        whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    )
    text = "".join(d.delta.text for d in deltas)  # type: ignore[union-attr]
    assert text == whole.content[0].text  # type: ignore[union-attr]
    assert all(e.index == 0 for e in events[1:-2])  # type: ignore[union-attr]
    end = events[-2]
    assert end.type == "message_delta" and end.delta.stop_reason == whole.stop_reason
    assert end.usage.output_tokens == whole.usage.output_tokens
    # the client's stream helper takes the same events
    with client.messages.stream(**args) as stream:
        helped = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert helped == text == final.content[0].text  # type: ignore[union-attr]
    assert (
        final.stop_reason == whole.stop_reason
        and final.usage.output_tokens == end.usage.output_tokens
    )


def test_system_and_turns_render_as_chat(client: Anthropic, chat: OpenAI) -> None:
    turns = [
        {"role": "system", "content": "Answer briefly.\nBe kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a color.\nOne word."},
    ]
    expected = _chat(chat, turns, 8)
    out = client.messages.create(
        model="",
        system=[{"type": "text", "text": "Answer briefly."}, {"type": "text", "text": "Be kind."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Name a color.",
                        "cache_control": {"type": "ephemeral"},
                    },
                    {"type": "text", "text": "One word."},
                ],
            },
        ],
        max_tokens=8,
        extra_body=GREEDY,
    )
    assert expected.usage is not None
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == (
        expected.usage.prompt_tokens
    )
    assert out.content[0].text == expected.choices[0].message.content  # type: ignore[union-attr]


def test_a_final_assistant_turn_is_continued(client: Anthropic, chat: OpenAI) -> None:
    turns = [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "One,"},
    ]
    expected = _chat(
        chat, turns, 6, extra_body={"continue_final_message": True, "add_generation_prompt": False}
    )
    out = client.messages.create(model="", messages=turns, max_tokens=6, extra_body=GREEDY)  # type: ignore[arg-type]
    assert out.content[0].text == expected.choices[0].message.content  # type: ignore[union-attr]
    assert expected.usage is not None
    total = out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0)
    assert total == expected.usage.prompt_tokens


def test_stop_sequences_and_max_tokens(client: Anthropic) -> None:
    args: dict[str, Any] = {"model": "", "messages": HI, "extra_body": GREEDY}
    free = client.messages.create(max_tokens=24, **args)
    text = free.content[0].text  # type: ignore[union-attr]
    assert len(text) > 4
    word = text[2:4]  # a piece of the answer, so generation stops there
    out = client.messages.create(max_tokens=24, stop_sequences=["#never#", word], **args)
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == word
    assert out.content[0].text == text[: text.index(word)]  # type: ignore[union-attr]
    events = list(client.messages.create(max_tokens=24, stop_sequences=[word], stream=True, **args))
    delta = events[-2]
    assert delta.type == "message_delta"
    assert (delta.delta.stop_reason, delta.delta.stop_sequence) == ("stop_sequence", word)
    cut = client.messages.create(max_tokens=2, **args)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


def test_count_tokens_counts_the_prompt(client: Anthropic, server: ServerThread) -> None:
    system = "Answer briefly."
    counted = client.messages.count_tokens(model="", system=system, messages=HI)  # type: ignore[arg-type]
    out = client.messages.create(model="", system=system, messages=HI, max_tokens=1)  # type: ignore[arg-type]
    assert counted.input_tokens == out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0)
    tokenizer = server.engine.tokenizer
    rendered = tokenizer.render_chat([{"role": "system", "content": system}, *HI])
    assert counted.input_tokens == len(tokenizer.encode(rendered, False))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**6}, "max_tokens"),  # past the context: refused, as chat's
        ({"temperature": -1}, "temperature"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].source.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": 5}}}},
            "output_config.format.schema",
        ),
        ({"container": "c1"}, "container"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_requests_are_anthropic_errors_naming_the_field(
    client: Anthropic, change: dict[str, Any], field: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="", messages=HI, max_tokens=4, extra_body=change)  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert field in error["error"]["message"], error


def test_an_unknown_model_and_broken_json_keep_the_shape(
    client: Anthropic, server: ServerThread
) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-nonesuch", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(urllib.error.HTTPError) as broken:
        headers = {"Content-Type": "application/json"}
        broken_body = urllib.request.Request(f"{server.url}/v1/messages", b"{", headers)
        urllib.request.urlopen(broken_body, timeout=60)
    assert broken.value.code == 400
    error = json.loads(broken.value.read())
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in error["error"]["message"]


@pytest.fixture(scope="module")
def keyed(server: ServerThread) -> Iterator[str]:
    yield server.add_gateway(GatewaySettings(api_key="sesame"))


def test_the_api_key_comes_as_x_api_key(keyed: str) -> None:
    good = Anthropic(base_url=keyed, api_key="sesame", max_retries=0, timeout=60)
    assert good.messages.create(model="", messages=HI, max_tokens=2).usage.output_tokens == 2  # type: ignore[arg-type]
    assert good.messages.count_tokens(model="", messages=HI).input_tokens > 0  # type: ignore[arg-type]
    bearer = Anthropic(base_url=keyed, auth_token="sesame", max_retries=0, timeout=60)
    assert bearer.messages.create(model="", messages=HI, max_tokens=1).content  # type: ignore[arg-type]
    bad = Anthropic(base_url=keyed, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        bad.messages.create(model="", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }
