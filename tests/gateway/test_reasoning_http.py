"""`troupe serve --reasoning-parser` over HTTP with the official `openai` client: a fake runner
made to say exact replies through a Qwen3-style template (thinking on, off, or opened by the
prompt), the thinking in `reasoning_content` and the rest in `content`, whole and streamed
(the two agree); tool calls parsed from the content only; deepseek_r1's answers start in
thought; no parser, no field. Structured output (and a named tool call) constrains only the
content: the scripted tokens pass the engine's grammar matcher, which fails a request at the
first token it refuses, so a reply that thinks where the grammar allows no thinking fails."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model
from tests.gateway.test_tool_auto_http import TOOLS

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
{{ m['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% elif think_open is defined and think_open %}<think>
{% endif %}{% endif %}"""

MESSAGES = [{"role": "user", "content": "Hi there"}]


def _server(folder: Path, parser: str | None) -> ServerThread:
    return scripted_server(folder, GatewaySettings(reasoning_parser=parser))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return template_model(tmp_path_factory.mktemp("thinking-model"), TEMPLATE)


@pytest.fixture(scope="module")
def servers(model: Path) -> Iterator[dict[str | None, ServerThread]]:
    started = {parser: _server(model, parser).start() for parser in ("qwen3", "deepseek_r1", None)}
    yield started
    for server in started.values():
        server.shutdown()


def _ask(server: ServerThread, **extra: Any) -> tuple[Any, tuple[str | None, str | None]]:
    """The whole answer's message, and the streamed answer's (reasoning, content)."""
    client = openai_client(server.url)
    body: dict[str, Any] = {"model": server.engine.model_name, "messages": MESSAGES, **extra}
    whole = client.chat.completions.create(max_tokens=64, **body)
    reasoning: list[str] = []
    content: list[str] = []
    for chunk in client.chat.completions.create(max_tokens=64, stream=True, **body):
        for choice in chunk.choices:
            delta = choice.delta
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            content.append(delta.content or "")
    streamed = ("".join(reasoning) or None, "".join(content) or None)
    return whole.choices[0].message, streamed


def _parts(message: Any) -> tuple[str | None, str | None]:
    return (message.model_extra or {}).get("reasoning_content"), message.content


@pytest.mark.parametrize(
    ("parser", "reply", "kwargs", "expected"),
    [
        (
            "qwen3",
            "<think>\nThe user greets.\n</think>\n\nHello!",
            None,
            ("\nThe user greets.\n", "\n\nHello!"),
        ),
        (
            "qwen3",
            "Plain words, a </think> in them.",
            {"enable_thinking": False},
            (None, "Plain words, a </think> in them."),
        ),
        (
            "qwen3",
            "Opened by the prompt.</think>Answer.",
            {"think_open": True},
            ("Opened by the prompt.", "Answer."),
        ),
        ("qwen3", "No tags.", None, (None, "No tags.")),
        ("deepseek_r1", "Step one, step two.</think>Done.", None, ("Step one, step two.", "Done.")),
        ("deepseek_r1", "Cut off while thinking", None, ("Cut off while thinking", None)),
    ],
)
def test_thinking_goes_to_reasoning_content(servers, parser, reply, kwargs, expected) -> None:  # type: ignore[no-untyped-def]
    server = servers[parser]
    say(server, reply)
    extra = {"extra_body": {"chat_template_kwargs": kwargs}} if kwargs else {}
    message, streamed = _ask(server, **extra)
    assert _parts(message) == expected
    assert streamed == expected


@pytest.mark.parametrize(
    ("reply", "content"),
    [("Step one.</think>Done.", "Done."), ("Cut off while thinking", None)],
)
def test_include_reasoning_false_drops_the_thinking(servers, reply: str, content: Any) -> None:  # type: ignore[no-untyped-def]
    """vLLM's include_reasoning: the thinking is parsed away and not sent, whole or streamed
    (no reasoning chunk goes out); the content is what it was."""
    server = servers["deepseek_r1"]
    say(server, reply)
    message, streamed = _ask(server, extra_body={"include_reasoning": False})
    assert _parts(message) == (None, content) and streamed == (None, content)
    chunks = list(
        openai_client(server.url).chat.completions.create(
            model=server.engine.model_name,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=64,
            stream=True,
            extra_body={"include_reasoning": False},
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any((d.model_extra or {}).get("reasoning_content") for d in deltas)
    assert all(d.content for d in deltas[1:-1])  # no chunk stands for the dropped thinking


def test_reasoning_effort_reaches_the_template(servers) -> None:  # type: ignore[no-untyped-def]
    """OpenAI's chat reasoning_effort is the template's `reasoning_effort` (as the Responses
    API's reasoning.effort is); a value outside low/medium/high is a 400 naming it."""
    server = servers["qwen3"]
    say(server, "Fine.")
    client = openai_client(server.url)
    body: dict[str, Any] = {"model": server.engine.model_name, "messages": MESSAGES}
    out = client.chat.completions.create(
        max_tokens=4, reasoning_effort="high", extra_body={"return_token_ids": True}, **body
    )
    ran = server.engine.tokenizer.decode((out.model_extra or {})["prompt_token_ids"], False)
    assert "Reasoning: high" in ran
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(max_tokens=4, reasoning_effort="extreme", **body)  # type: ignore[arg-type]
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "reasoning_effort"


def test_tool_calls_come_from_the_content(servers) -> None:  # type: ignore[no-untyped-def]
    server = servers["qwen3"]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    say(server, "<think>A tool would know.</think>\n" + call)
    client = openai_client(server.url)
    out = client.chat.completions.create(
        model=server.engine.model_name,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=64,  # type: ignore[arg-type]
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.model_extra or {}).get("reasoning_content") == "A tool would know."
    calls = choice.message.tool_calls
    assert calls is not None and calls[0].function.name == "get_weather"  # type: ignore[union-attr]


def test_no_parser_no_field(servers) -> None:  # type: ignore[no-untyped-def]
    server = servers[None]
    say(server, "<think>Hidden?</think>Shown.")
    message, streamed = _ask(server)
    assert "reasoning_content" not in (message.model_extra or {})
    assert message.content == "<think>Hidden?</think>Shown."
    assert streamed == (None, "<think>Hidden?</think>Shown.")


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


@pytest.mark.parametrize(
    ("parser", "reply", "kwargs", "expected"),
    [
        ("deepseek_r1", 'a is 1.</think>{"a": 1}', None, ("a is 1.", '{"a": 1}')),
        ("qwen3", '<think>a is 1.</think>{"a": 1}', None, ("a is 1.", '{"a": 1}')),
        ("qwen3", '{"a": 1}', None, (None, '{"a": 1}')),  # thinking is the model's choice
        ("qwen3", 'Opened.</think>{"a": 1}', {"think_open": True}, ("Opened.", '{"a": 1}')),
        ("qwen3", '{"a": 1}', {"enable_thinking": False}, (None, '{"a": 1}')),
    ],
)
def test_structured_output_starts_after_the_thinking(
    servers, parser, reply, kwargs, expected
) -> None:  # type: ignore[no-untyped-def]
    server = servers[parser]
    say(server, reply)
    extra: dict[str, Any] = {"chat_template_kwargs": kwargs} if kwargs else {}
    message, streamed = _ask(server, response_format=JSON_FORMAT, extra_body=extra)
    assert _parts(message) == expected
    assert streamed == expected
    assert json.loads(message.content) == {"a": 1}


@pytest.mark.parametrize(
    ("parser", "reply", "kwargs"),
    [
        ("deepseek_r1", "a is 1.</think>A is one.", None),  # after the thinking: JSON
        ("qwen3", 'a is 1.</think>{"a": 1}', None),  # not opened: no thinking to close
        ("qwen3", '<think>a is 1.</think>{"a": 1}', {"enable_thinking": False}),  # thinking off
        ("qwen3", '<think>a is 1.</think>{"a": "one"}', None),  # the schema still holds
    ],
)
def test_structured_output_refuses_what_the_parser_would_not_read(  # type: ignore[no-untyped-def]
    servers, parser, reply, kwargs
) -> None:
    server = servers[parser]
    say(server, reply)
    client = openai_client(server.url)
    extra = {"chat_template_kwargs": kwargs} if kwargs else {}
    with pytest.raises(openai.APIStatusError, match="structured output failed"):
        client.chat.completions.create(
            model=server.engine.model_name,
            messages=MESSAGES,  # type: ignore[arg-type]
            response_format=JSON_FORMAT,  # type: ignore[arg-type]
            max_tokens=64,
            extra_body=extra,
        )


def test_a_named_tool_call_follows_the_thinking(servers) -> None:  # type: ignore[no-untyped-def]
    server = servers["deepseek_r1"]
    say(server, 'A tool would know.</think>{"city": "Paris"}')
    client = openai_client(server.url)
    out = client.chat.completions.create(
        model=server.engine.model_name,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
    )
    choice = out.choices[0]
    assert (choice.message.model_extra or {}).get("reasoning_content") == "A tool would know."
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
