"""`troupe serve --reasoning-parser openai_gptoss` over HTTP with the official `openai` client:
a scripted runner says a harmony answer (GPT-OSS's channel markers are special tokens of its
tokenizer), whole and streamed; the analysis channel comes back as `reasoning_content`, the
final channel as `content`, no marker in either (the request ran with its special tokens
kept, the parser dropped them, and the EOS that ended the answer is not text, as in vLLM); with
tools, the call the model addresses to `functions.get_weather` comes back as a tool call, the
chat template having chosen the `openai` tool-call parser."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from troupe.gateway.harmony import MARKERS
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, openai_client, post_json, scripted_server

# GPT-OSS's template in small: tools in a developer message, a call as `<|start|>assistant
# to=functions.NAME...` (what makes "auto" read calls as `openai`), a result from functions.NAME;
# a call turn's analysis from its content or its `thinking` (refusing both) until a later answer
TEMPLATE = """\
{%- if tools %}<|start|>developer<|message|># Tools
{%- for t in tools %} {{ t['function']['name'] }}{% endfor %}<|end|>{% endif %}
{%- for m in messages %}
{%- if m['role'] == 'assistant' and m['tool_calls'] is defined %}
{%- set later = namespace(final=false) %}
{%- for f in messages[loop.index:] %}
{%- if f['role'] == 'assistant' and 'tool_calls' not in f %}{% set later.final = true %}{% endif %}
{%- endfor %}
{%- if m.content and m.thinking %}{{ raise_exception('Cannot pass both content and thinking') }}
{%- elif m.content and not later.final %}<|start|>assistant<|channel|>analysis<|message|>\
{{- m.content }}<|end|>
{%- elif m.thinking and not later.final %}<|start|>assistant<|channel|>analysis<|message|>\
{{- m.thinking }}<|end|>{% endif %}
{%- for c in m['tool_calls'] %}<|start|>assistant to=functions.{{ c['function']['name'] -}}
<|channel|>commentary json<|message|>{{ c['function']['arguments']|tojson }}<|call|>
{%- endfor %}
{%- elif m['role'] == 'tool' %}<|start|>functions.tool to=assistant<|channel|>commentary\
<|message|>{{ m['content']|tojson }}<|end|>
{%- else %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""
REPLY = (
    "<|channel|>analysis<|message|>The user greets. Reply politely.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """SmolLM2's tokenizer with harmony's markers added as special tokens."""
    from troupe.actors.core.tokenizer_files import load_tokenizer

    folder = tmp_path_factory.mktemp("harmony-model")
    tokenizer = load_tokenizer().tokenizer
    tokenizer.add_special_tokens(list(MARKERS))
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "chat_template": TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    settings = GatewaySettings(reasoning_parser="openai_gptoss")
    size = tokenizer.get_vocab_size(with_added_tokens=True)  # the markers' ids are the model's
    started = scripted_server(folder, settings, vocab_size=size).start()
    yield started
    started.shutdown()


def _say(server: ServerThread, text: str) -> None:
    tokenizer = server.engine.tokenizer
    ids = tokenizer.encode(text, False)
    assert tokenizer.decode(ids, False) == text
    assert tokenizer.decode(ids) != text  # the markers are special: skipped by default
    server.runner.script = (*ids, *tokenizer.eos_token_ids[:1])


def test_analysis_is_reasoning_and_final_is_content(server: ServerThread) -> None:
    _say(server, REPLY)
    client = openai_client(server.url)
    body: dict[str, Any] = {
        "model": server.engine.model_name,
        "messages": [{"role": "user", "content": "Hi there"}],
        "max_tokens": 64,
    }
    whole = client.chat.completions.create(**body).choices[0].message
    expected = ("The user greets. Reply politely.", "Hello! How can I help?")
    assert ((whole.model_extra or {}).get("reasoning_content"), whole.content) == expected
    reasoning: list[str] = []
    content: list[str] = []
    for chunk in client.chat.completions.create(stream=True, **body):
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert ("".join(reasoning), "".join(content)) == expected


CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary"
    ' to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_a_call_to_a_function_is_a_tool_call(server: ServerThread) -> None:
    """The answer stops at the call (its <|call|> ends it, as GPT-OSS's generation_config
    says; here the scripted EOS): one tool call, the thinking as reasoning, no content."""
    _say(server, CALL)
    client = openai_client(server.url)
    history = [
        {"role": "user", "content": "Weather in Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        {"role": "user", "content": "And Paris?"},
    ]
    body: dict[str, Any] = {
        "model": server.engine.model_name,
        "messages": history,
        "tools": TOOLS,
        "max_tokens": 64,
    }
    choice = client.chat.completions.create(**body).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.model_extra or {}).get("reasoning_content") == "Need the weather."
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert calls[0].id.startswith("chatcmpl-tool-")
    reasoning, content, names, arguments, finish = "", "", [], "", None
    for chunk in client.chat.completions.create(stream=True, **body):
        for delta_choice in chunk.choices:
            delta = delta_choice.delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
            for call in delta.tool_calls or []:
                if call.function and call.function.name:
                    names.append(call.function.name)
                arguments += (call.function.arguments or "") if call.function else ""
            finish = delta_choice.finish_reason or finish
    assert (reasoning, content, names, finish) == (
        "Need the weather.",
        "",
        ["get_weather"],
        "tool_calls",
    )
    assert json.loads(arguments) == {"city": "Paris"}
    plain = client.chat.completions.create(**{**body, "tool_choice": "none"}).choices[0]
    assert (plain.finish_reason, plain.message.content, plain.message.tool_calls) == (
        "stop",
        None,
        None,
    )  # no tools asked for: the call is dropped, as vLLM drops it


def test_responses_and_messages_read_the_call_too(server: ServerThread) -> None:
    _say(server, CALL)
    model = server.engine.model_name
    question = [{"role": "user", "content": "Weather in Paris?"}]
    status, answer = post_json(
        server.url,
        "/v1/responses",
        {
            "model": model,
            "input": question,
            "tools": [{"type": "function", **TOOLS[0]["function"]}],
        },
    )
    assert status == 200, answer
    calls = [item for item in answer["output"] if item["type"] == "function_call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    schema = TOOLS[0]["function"]["parameters"]
    status, answer = post_json(
        server.url,
        "/v1/messages",
        {
            "model": model,
            "max_tokens": 64,
            "messages": question,
            "tools": [{"name": "get_weather", "input_schema": schema}],
        },
    )
    assert status == 200, answer
    assert answer["stop_reason"] == "tool_use"
    uses = [block for block in answer["content"] if block["type"] == "tool_use"]
    assert [(u["name"], u["input"]) for u in uses] == [("get_weather", {"city": "Paris"})]


def test_structured_output_holds_the_final_body(server: ServerThread) -> None:
    """The grammar lets the model think first, then holds the final channel's body to the
    schema (StructuredOutputs.reasoning "harmony"); an answer without harmony's header is
    refused at its first token."""
    schema = TOOLS[0]["function"]["parameters"] | {"required": ["city"]}
    body: dict[str, Any] = {
        "model": server.engine.model_name,
        "messages": [{"role": "user", "content": "A city, as JSON"}],
        "max_tokens": 64,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    }
    _say(
        server,
        f'{REPLY[: REPLY.index("<|start|>")]}<|start|>assistant<|channel|>final<|message|>{{"city": "Paris"}}',
    )
    message = openai_client(server.url).chat.completions.create(**body).choices[0].message
    assert (message.model_extra or {}).get(
        "reasoning_content"
    ) == "The user greets. Reply politely."
    assert json.loads(message.content or "") == {"city": "Paris"}
    tokenizer = server.engine.tokenizer
    server.runner.script = (
        *tokenizer.encode('{"city": "Paris"}', False),
        tokenizer.eos_token_ids[0],
    )
    status, answer = post_json(server.url, "/v1/chat/completions", body)
    assert status == 500 and "structured output failed" in json.dumps(answer), answer


def test_required_and_named_tool_choices_hold_the_final_body(server: ServerThread) -> None:
    """tool_choice "required" and a named function constrain the final channel's body (after
    the thinking) to the calls' JSON, which comes back as tool calls."""
    body: dict[str, Any] = {
        "model": server.engine.model_name,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
        "max_tokens": 64,
    }
    head = (
        "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>final<|message|>"
    )
    client = openai_client(server.url)
    for choice, final in (
        ("required", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
        ({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Paris"}'),
    ):
        _say(server, head + final)
        answer = client.chat.completions.create(**body, tool_choice=choice).choices[0]  # type: ignore[arg-type]
        calls = answer.message.tool_calls or []
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"})
        ], choice
        assert (answer.message.model_extra or {}).get("reasoning_content") == "Call it."


def _prompt_of(server: ServerThread, body: dict[str, Any]) -> str:
    """The prompt a chat request ran, markers kept (vLLM's return_token_ids)."""
    status, answer = post_json(
        server.url, "/v1/chat/completions", {**body, "return_token_ids": True}
    )
    assert status == 200, answer
    return server.engine.tokenizer.decode(answer["prompt_token_ids"], False)


def test_a_call_turn_keeps_its_thinking(server: ServerThread) -> None:
    """A call turn sent back whole (thinking, a preamble, the call) renders: the template
    refuses content beside `thinking`, so the preamble joins the thinking it followed; the
    thinking stays until a later answer, as GPT-OSS's template and vLLM keep it."""
    _say(server, REPLY)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    turn = {"role": "assistant", "content": "Checking.", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}
    question = {"role": "user", "content": "Weather?"}
    body: dict[str, Any] = {"model": server.engine.model_name, "max_tokens": 8, "tools": TOOLS}
    analysis = "<|start|>assistant<|channel|>analysis<|message|>"
    calls = "<|start|>assistant to=functions.get_weather"
    for sent, kept in (
        ({**turn, "reasoning_content": "Need weather."}, "Need weather.\n\nChecking."),
        ({**turn, "content": None, "reasoning": "Need weather."}, "Need weather."),
        (turn, "Checking."),  # no thinking: the template's own reading of a call turn's content
    ):
        prompt = _prompt_of(server, {**body, "messages": [question, sent, result]})
        assert f"{analysis}{kept}<|end|>{calls}" in prompt, (sent, prompt)
    answered = [question, {**turn, "reasoning_content": "Need weather."}, result]
    answered += [{"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}]
    prompt = _prompt_of(server, {**body, "messages": answered})
    assert "Need weather." not in prompt and "Checking." not in prompt and calls in prompt


def test_a_responses_reasoning_item_is_its_call_turns_thinking(server: ServerThread) -> None:
    """The reasoning item a Responses client sends back before its function call renders as
    that call turn's analysis (the prompt's size says which messages the template got)."""
    from troupe.gateway.tokenize_routes import render_chat
    from troupe.messages import ChatMessage, ChatPrompt, ToolCall, ToolCallFunction

    _say(server, REPLY)
    thought = [{"type": "reasoning_text", "text": "Need weather."}]
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": thought},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
    ]
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    body = {"model": server.engine.model_name, "input": items, "tools": tools}
    status, answer = post_json(server.url, "/v1/responses", {**body, "max_output_tokens": 8})
    assert status == 200, answer
    call = ToolCall(id="c1", function=ToolCallFunction(name="get_weather", arguments="{}"))
    tokenizer = server.engine.tokenizer
    sizes = []
    for reasoning in ("Need weather.", None):
        messages = (
            ChatMessage(role="user", content="Weather?"),
            ChatMessage(role="assistant", tool_calls=(call,), reasoning=reasoning),
            ChatMessage(role="tool", content="Sunny", tool_call_id="c1"),
        )
        chat = ChatPrompt(messages=messages, template_kwargs={"tools": TOOLS})
        sizes.append(len(tokenizer.encode(render_chat(tokenizer, chat), False)))
    assert sizes[0] > sizes[1]
    assert answer["usage"]["input_tokens"] == sizes[0]
