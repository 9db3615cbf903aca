"""/v1/messages on a model whose template defines Hermes tool calls and Qwen3 thinking
(SmolLM2's tokenizer, a fake runner made to say exact replies, `--reasoning-parser qwen3`),
with the `anthropic` client: calls come back as tool_use blocks (stop_reason "tool_use"),
whole and streamed (input_json_delta pieces the client's helper parses), and go back into the
template as chat's assistant tool_calls and tool messages, so the next turn's prompt is the
chat conversation's; tool_choice any / tool / none; thinking as a thinking block, sent back
as the turn's reasoning; output_config.format constrains the text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from anthropic import Anthropic
from anthropic.types import Message
from troupe.gateway.anthropic_requests import parse_messages
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model
from tests.gateway.test_responses_tools import TEMPLATE
from tests.gateway.test_tool_auto_http import CALL, MESSAGES
from tests.gateway.test_tool_auto_http import TOOLS as CHAT_TOOLS

TOOLS: Any = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
QUESTION: Any = MESSAGES


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = template_model(tmp_path_factory.mktemp("anthropic-model"), TEMPLATE)
    server = scripted_server(folder, GatewaySettings(reasoning_parser="qwen3"))
    yield server.start()
    server.shutdown()


@pytest.fixture
def client(srv: ServerThread) -> Anthropic:
    return Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)


def _prompt_tokens(srv: ServerThread, messages: list[dict[str, Any]], **kwargs: Any) -> int:
    text = srv.engine.tokenizer.render_chat(messages, **kwargs)
    return len(srv.engine.tokenizer.encode(text, False))


def _input_tokens(out: Message) -> int:
    return out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0)


def test_a_call_comes_back_as_a_tool_use_block(srv: ServerThread, client: Anthropic) -> None:
    say(srv, "Let me check.\n" + CALL)
    raw = client.messages.with_raw_response.create(
        model="", messages=QUESTION, tools=TOOLS, max_tokens=64
    )
    out = Message.model_validate(raw.http_response.json())
    assert out.stop_reason == "tool_use"
    assert [b.type for b in out.content] == ["text", "tool_use"]
    assert out.content[0].text == "Let me check."  # type: ignore[union-attr]
    call = out.content[1]
    assert call.type == "tool_use" and call.name == "get_weather"
    assert call.input == {"city": "Paris"} and call.id
    assert _input_tokens(out) == _prompt_tokens(srv, MESSAGES, tools=CHAT_TOOLS)

    events = list(
        client.messages.create(model="", messages=QUESTION, tools=TOOLS, max_tokens=64, stream=True)
    )
    starts = [e for e in events if e.type == "content_block_start"]
    assert [(e.index, e.content_block.type) for e in starts] == [(0, "text"), (1, "tool_use")]
    assert starts[1].content_block.name == "get_weather"  # type: ignore[union-attr]
    pieces = [
        e.delta.partial_json  # type: ignore[union-attr]
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert json.loads("".join(pieces)) == {"city": "Paris"}
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert sorted(stops) == [0, 1]
    assert events[-2].delta.stop_reason == "tool_use"  # type: ignore[union-attr]
    # the client's stream helper builds the whole answer from them
    with client.messages.stream(model="", messages=QUESTION, tools=TOOLS, max_tokens=64) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
    assert final.content[0].text == "Let me check."  # type: ignore[union-attr]


def test_the_round_trip_renders_as_the_chat_conversation(
    srv: ServerThread, client: Anthropic
) -> None:
    say(srv, "Let me check.\n" + CALL)
    first = client.messages.create(model="", messages=QUESTION, tools=TOOLS, max_tokens=64)
    call = first.content[1]
    assert call.type == "tool_use"
    arguments = json.dumps(call.input)
    chat_messages: list[dict[str, Any]] = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"},
    ]
    srv.runner.script = None  # the fake model's own words: a function of the prompt
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"}
    second = client.messages.create(
        model="",
        messages=[
            *QUESTION,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
        tools=TOOLS,
        max_tokens=6,
        extra_body={"temperature": 0},
    )
    template_messages = json.loads(json.dumps(chat_messages))  # as vLLM hands them over
    template_messages[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    rendered = srv.engine.tokenizer.render_chat(template_messages, tools=CHAT_TOOLS)
    assert "Let me check.\n" + CALL + "<|im_end|>" in rendered  # the call, as the model wrote it
    assert _input_tokens(second) == _prompt_tokens(srv, template_messages, tools=CHAT_TOOLS)
    chat = openai_client(srv.url).chat.completions.create(
        model="",
        messages=chat_messages,  # type: ignore[arg-type]
        tools=CHAT_TOOLS,
        max_tokens=6,
        temperature=0,
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == _input_tokens(second)
    assert second.content[0].text == chat.choices[0].message.content  # type: ignore[union-attr]


def test_tool_choice_any_tool_and_none(srv: ServerThread, client: Anthropic) -> None:
    with_tools = _prompt_tokens(srv, MESSAGES, tools=CHAT_TOOLS)
    args: dict[str, Any] = {"model": "", "messages": QUESTION, "tools": TOOLS, "max_tokens": 64}
    say(srv, '[{"name": "get_weather", "arguments": {"city": "Paris"}}]')
    out = client.messages.create(tool_choice={"type": "any"}, **args)
    assert [b.type for b in out.content] == ["tool_use"] and out.stop_reason == "tool_use"
    assert out.content[0].input == {"city": "Paris"}  # type: ignore[union-attr]
    assert _input_tokens(out) == with_tools

    say(srv, '{"city": "Paris"}')
    named: Any = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    out = client.messages.create(tool_choice=named, **args)
    assert [b.type for b in out.content] == ["tool_use"] and out.stop_reason == "tool_use"
    assert out.content[0].input == {"city": "Paris"}  # type: ignore[union-attr]
    events = list(client.messages.create(tool_choice=named, stream=True, **args))
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta"]  # type: ignore[union-attr]
    assert len(pieces) > 1 and "".join(pieces) == '{"city": "Paris"}'  # as it is written

    say(srv, "No tools needed.")
    out = client.messages.create(tool_choice={"type": "none"}, **args)
    assert [b.type for b in out.content] == ["text"] and out.stop_reason == "end_turn"
    assert _input_tokens(out) == with_tools  # the tools are in the prompt all the same


def test_thinking_is_a_thinking_block_and_goes_back_as_reasoning(
    srv: ServerThread, client: Anthropic
) -> None:
    say(srv, "<think>\nThe user greets.\n</think>\n\nHello!")
    hi: Any = [{"role": "user", "content": "Hi"}]
    out = client.messages.create(model="", messages=hi, max_tokens=64)
    assert [b.type for b in out.content] == ["thinking", "text"]
    assert out.content[0].thinking == "\nThe user greets.\n"  # type: ignore[union-attr]
    assert out.content[1].text == "\n\nHello!"  # type: ignore[union-attr]
    with client.messages.stream(model="", messages=hi, max_tokens=64) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in kinds and "text_delta" in kinds
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in out.content]

    body = {
        "model": "",
        "max_tokens": 8,
        "thinking": {"type": "disabled"},
        "messages": [*hi, {"role": "assistant", "content": out.model_dump()["content"]}, *hi],
    }
    req = parse_messages(json.dumps(body).encode(), tool_parser="hermes")
    turn = req.prompt.messages[1]
    assert (turn.role, turn.content, turn.reasoning) == (
        "assistant",
        "\n\nHello!",
        "\nThe user greets.\n",
    )
    assert req.prompt.template_kwargs == {"enable_thinking": False}
    assert req.prompt.add_generation_prompt and not req.prompt.continue_final_message


def test_output_config_format_constrains_the_text(srv: ServerThread, client: Anthropic) -> None:
    schema = {
        "type": "object",
        "properties": {"size": {"enum": ["small", "large"]}},
        "required": ["size"],
    }
    body = {
        "model": "",
        "max_tokens": 8,
        "messages": MESSAGES,
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    req = parse_messages(json.dumps(body).encode(), tool_parser="hermes")
    spec = req.params.structured_outputs
    assert spec is not None and json.loads(spec.json) == schema
    say(srv, '{"size": "small"}')
    out = client.messages.create(
        model="",
        messages=QUESTION,
        max_tokens=32,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    text = out.content[0].text  # type: ignore[union-attr]
    jsonschema.validate(json.loads(text), schema)
    assert out.stop_reason == "end_turn"
