"""/v1/responses on a model whose template defines Hermes tool calls and Qwen3 thinking
(SmolLM2's tokenizer, a fake runner made to say exact replies, `--reasoning-parser qwen3`):
function calls come back as function_call items, whole and streamed, and go back into the
template as an assistant message's tool_calls (the function's output as a tool message
answering the call's id), so the next turn's prompt is the chat conversation's; the declared
tools in the prompt under every tool_choice; "required" and named functions; the thinking as a
reasoning item; an answer cut short by max_output_tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec
import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response
from troupe.gateway.responses_requests import parse_responses
from troupe.gateway.state import GatewaySettings
from troupe.messages import ChatPrompt

from tests.gateway.conftest import ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model
from tests.gateway.test_tool_auto_http import CALL, MESSAGES
from tests.gateway.test_tool_auto_http import TOOLS as CHAT_TOOLS

TEMPLATE = """\
{%- if tools %}<|im_start|>system
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Answer a call as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}
{%- if reasoning_effort is defined %}<|im_start|>system
Reasoning: {{ reasoning_effort }}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}
{%- for c in m.tool_calls or [] %}
{{ "\n" }}<tool_call>
{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}
</tool_call>
{%- endfor %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS: Any = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
QUESTION = MESSAGES[0]["content"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = template_model(tmp_path_factory.mktemp("responses-model"), TEMPLATE)
    server = scripted_server(folder, GatewaySettings(reasoning_parser="qwen3"))
    yield server.start()
    server.shutdown()


@pytest.fixture
def client(srv: ServerThread) -> OpenAI:
    return openai_client(srv.url)


def _prompt_tokens(srv: ServerThread, messages: list[dict[str, Any]], **kwargs: Any) -> int:
    text = srv.engine.tokenizer.render_chat(messages, **kwargs)
    return len(srv.engine.tokenizer.encode(text, False))


def test_a_function_call_comes_back_as_an_item(srv: ServerThread, client: OpenAI) -> None:
    say(srv, "Let me check.\n" + CALL)
    raw = client.responses.with_raw_response.create(
        model="", input=QUESTION, tools=TOOLS, max_output_tokens=64
    )
    out = Response.model_validate(raw.http_response.json())
    assert out.status == "completed"
    assert [item.type for item in out.output] == ["message", "function_call"]
    assert out.output_text == "Let me check."
    call = out.output[1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert out.usage is not None
    assert out.usage.input_tokens == _prompt_tokens(
        srv, [{"role": "user", "content": QUESTION}], tools=CHAT_TOOLS
    )

    events = list(
        client.responses.create(
            model="", input=QUESTION, tools=TOOLS, max_output_tokens=64, stream=True
        )
    )
    kinds = [e.type for e in events]
    at = kinds.index("response.function_call_arguments.delta")  # the call streams as written
    assert kinds[at - 1] == "response.output_item.added"
    assert [k for k in kinds[at:] if k != "response.function_call_arguments.delta"] == [
        "response.output_text.done",  # the message stays open while a call streams
        "response.content_part.done",
        "response.output_item.done",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[kinds.index("response.function_call_arguments.done")]
    assert events[at - 1].output_index == done.output_index == events[-2].output_index == 1
    streamed = events[-1].response.output[1]
    assert done.arguments == streamed.arguments == call.arguments  # the whole answer's
    assert streamed.name == "get_weather" and streamed.call_id == events[at - 1].item.call_id
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        "Let me check."
    )
    # the client's stream helper takes them too
    with client.responses.stream(
        model="", input=QUESTION, tools=TOOLS, max_output_tokens=64
    ) as stream:
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert json.loads(final.output[1].arguments) == {"city": "Paris"}  # type: ignore[union-attr]


def test_the_round_trip_renders_as_the_chat_conversation(srv: ServerThread, client: OpenAI) -> None:
    say(srv, "Let me check.\n" + CALL)
    first = client.responses.create(model="", input=QUESTION, tools=TOOLS, max_output_tokens=64)
    call = first.output[1]
    assert call.type == "function_call"
    chat_call = {"name": call.name, "arguments": call.arguments}
    chat_messages: list[dict[str, Any]] = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [{"id": call.call_id, "type": "function", "function": chat_call}],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 24 C"},
    ]
    # the template's dicts, as vLLM hands them over (arguments parsed)
    template_messages = json.loads(json.dumps(chat_messages))
    template_messages[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    srv.runner.script = None  # the fake model's own words: a function of the prompt
    args: dict[str, Any] = {"max_output_tokens": 6, "temperature": 0}
    second = client.responses.create(
        model="",
        input=[
            {"role": "user", "content": QUESTION},
            *first.output,  # type: ignore[list-item]
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"},
        ],
        tools=TOOLS,
        **args,
    )
    assert second.usage is not None
    rendered = srv.engine.tokenizer.render_chat(template_messages, tools=CHAT_TOOLS)
    assert "Let me check.\n" + CALL + "<|im_end|>" in rendered  # the call, as the model wrote it
    assert second.usage.input_tokens == _prompt_tokens(srv, template_messages, tools=CHAT_TOOLS)
    chat = client.chat.completions.create(
        model="",
        messages=chat_messages,  # type: ignore[arg-type]
        tools=CHAT_TOOLS,
        max_tokens=6,
        temperature=0,
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == second.usage.input_tokens
    assert second.output_text == chat.choices[0].message.content


@pytest.mark.parametrize(
    "choice", ["auto", "required", "none", {"type": "function", "name": "get_weather"}]
)
def test_the_tools_reach_the_template_under_every_tool_choice(
    srv: ServerThread, choice: Any
) -> None:
    """As chat's (vLLM's default): every turn of an agent loop renders the same prompt."""
    body = {"model": "", "input": QUESTION, "tools": TOOLS, "tool_choice": choice}
    req = parse_responses(json.dumps(body).encode(), default_max_tokens=64, tool_parser="hermes")
    assert isinstance(req.prompt, ChatPrompt)
    assert req.prompt.template_kwargs == {"tools": CHAT_TOOLS}  # in chat's nesting
    messages = [msgspec.to_builtins(m) for m in req.prompt.messages]
    rendered = srv.engine.tokenizer.render_chat(messages, **req.prompt.template_kwargs)
    assert "<tools>" in rendered and '"name": "get_weather"' in rendered
    # no tools, no tools variable: the template's tool-less prompt
    plain = parse_responses(b'{"input": "Hi"}', default_max_tokens=64, tool_parser="hermes")
    assert isinstance(plain.prompt, list)


def test_required_and_named_function_calls(srv: ServerThread, client: OpenAI) -> None:
    with_tools = _prompt_tokens(srv, [{"role": "user", "content": QUESTION}], tools=CHAT_TOOLS)
    say(srv, '[{"name": "get_weather", "arguments": {"city": "Paris"}}]')
    out = client.responses.create(
        model="", input=QUESTION, tools=TOOLS, tool_choice="required", max_output_tokens=64
    )
    assert [item.type for item in out.output] == ["function_call"]
    assert json.loads(out.output[0].arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert out.usage is not None and out.usage.input_tokens == with_tools  # the tools rendered

    say(srv, '{"city": "Paris"}')
    named: Any = {"type": "function", "name": "get_weather"}
    args: dict[str, Any] = {"model": "", "input": QUESTION, "tools": TOOLS, "tool_choice": named}
    out = client.responses.create(max_output_tokens=64, **args)
    assert out.usage is not None and out.usage.input_tokens == with_tools
    assert out.tool_choice.type == "function"  # type: ignore[union-attr]
    assert [item.type for item in out.output] == ["function_call"]
    assert out.output[0].arguments == '{"city": "Paris"}'  # type: ignore[union-attr]
    events = list(client.responses.create(max_output_tokens=64, stream=True, **args))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == '{"city": "Paris"}'  # as it is written
    assert events[2].type == "response.output_item.added" and events[2].item.arguments == ""


def test_thinking_is_a_reasoning_item(srv: ServerThread, client: OpenAI) -> None:
    say(srv, "<think>\nThe user greets.\n</think>\n\nHello!")
    raw = client.responses.with_raw_response.create(model="", input="Hi", max_output_tokens=64)
    out = Response.model_validate(raw.http_response.json())
    assert [item.type for item in out.output] == ["reasoning", "message"]
    reasoning = out.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "\nThe user greets.\n"
    assert out.output_text == "\n\nHello!"
    assert out.usage is not None
    assert 0 < out.usage.output_tokens_details.reasoning_tokens < out.usage.output_tokens

    events = list(client.responses.create(model="", input="Hi", max_output_tokens=64, stream=True))
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, said) == ("\nThe user greets.\n", "\n\nHello!")
    done = [e.item.type for e in events if e.type == "response.output_item.done"]
    assert done == ["reasoning", "message"]
    assert events[-1].response.usage.output_tokens_details.reasoning_tokens == (
        out.usage.output_tokens_details.reasoning_tokens
    )


def test_reasoning_effort_reaches_the_template(srv: ServerThread, client: OpenAI) -> None:
    say(srv, "Fine.")
    out = client.responses.create(
        model="", input="Hi", reasoning={"effort": "low"}, max_output_tokens=8
    )
    messages = [{"role": "user", "content": "Hi"}]
    assert out.usage is not None
    assert out.usage.input_tokens == _prompt_tokens(srv, messages, reasoning_effort="low")
    assert out.usage.input_tokens > _prompt_tokens(srv, messages)
    assert out.reasoning is not None and out.reasoning.effort == "low"


def test_an_answer_cut_short_is_incomplete(srv: ServerThread, client: OpenAI) -> None:
    say(srv, "one two three four five six seven")
    out = client.responses.create(model="", input="Count.", max_output_tokens=3)
    assert out.status == "incomplete"
    assert out.incomplete_details is not None
    assert out.incomplete_details.reason == "max_output_tokens"
    assert out.output_text and "one two three four five six seven".startswith(out.output_text)
    assert out.output_text != "one two three four five six seven"
    # a call cut short is the text the model wrote, as on chat
    say(srv, CALL)
    out = client.responses.create(model="", input=QUESTION, tools=TOOLS, max_output_tokens=4)
    assert out.status == "incomplete"
    assert [item.type for item in out.output] == ["message"]
    assert "<tool_call>".startswith(out.output_text) and len(out.output_text) > 1
    assert out.usage is not None and out.usage.output_tokens_details.reasoning_tokens == 0


def test_a_failure_mid_stream_is_an_error_event(srv: ServerThread, client: OpenAI) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt: Any = {"type": "json_schema", "name": "a", "schema": schema}
    say(srv, '{"a": "one"}')  # the grammar refuses the string after the first tokens
    args: dict[str, Any] = {"model": "", "input": "Hi", "text": {"format": fmt}}
    with pytest.raises(openai.InternalServerError, match="structured output failed"):
        client.responses.create(max_output_tokens=32, **args)
    events = list(client.responses.create(max_output_tokens=32, stream=True, **args))
    assert events[0].type == "response.created"
    assert "response.output_text.delta" in [e.type for e in events]
    last = events[-1]
    assert last.type == "error" and "structured output failed" in last.message
    assert last.sequence_number == len(events) - 1
