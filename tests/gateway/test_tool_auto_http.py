"""tool_choice "auto" over HTTP with the official `openai` client, on a model whose chat
template defines Hermes tool calls (SmolLM2's tokenizer with a Qwen-style template, a fake
runner made to say exact replies): the tools reach the prompt through the template, a reply
with `<tool_call>` blocks comes back as `tool_calls` (whole and streamed), plain text stays
text; the default model's template defines no format, so "auto" is a 400 there."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import BASE_CONFIG, ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model

HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call these functions:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Answer a call as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def hermes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = template_model(tmp_path_factory.mktemp("hermes-model"), HERMES_TEMPLATE)
    srv = scripted_server(folder, GatewaySettings()).start()
    yield srv
    srv.shutdown()


def _client(server: ServerThread) -> OpenAI:
    return openai_client(server.url)


def test_the_tools_reach_the_prompt(hermes: ServerThread) -> None:
    say(hermes, "Sunny.")
    client = _client(hermes)
    name = hermes.engine.model_name
    with_tools = client.chat.completions.create(
        model=name,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=8,  # type: ignore[arg-type]
    )
    plain = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=8)  # type: ignore[arg-type]
    rendered = hermes.engine.tokenizer.render_chat(MESSAGES, tools=TOOLS)
    assert '"name": "get_weather"' in rendered
    assert with_tools.usage is not None and plain.usage is not None
    want = len(hermes.engine.tokenizer.encode(rendered, False))
    assert with_tools.usage.prompt_tokens == want > plain.usage.prompt_tokens
    # plain text under "auto": content, no calls
    assert with_tools.choices[0].message.content == "Sunny."
    assert with_tools.choices[0].message.tool_calls is None
    assert with_tools.choices[0].finish_reason == "stop"


def test_a_tool_call_comes_back_whole_and_streamed(hermes: ServerThread) -> None:
    say(hermes, "Let me check.\n" + CALL)
    client = _client(hermes)
    name = hermes.engine.model_name
    out = client.chat.completions.create(
        model=name,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="auto",
        max_tokens=64,  # type: ignore[arg-type]
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]

    content, names, arguments, finishes = "", [], "", []
    for chunk in client.chat.completions.create(
        model=name,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=64,
        stream=True,  # type: ignore[arg-type]
    ):
        for c in chunk.choices:
            content += c.delta.content or ""
            for call in c.delta.tool_calls or ():
                if call.function and call.function.name:  # the name first, then arguments
                    names.append(call.function.name)
                arguments += (call.function.arguments or "") if call.function else ""
            if c.finish_reason:
                finishes.append(c.finish_reason)
    assert content.strip() == "Let me check." and "<tool_call>" not in content
    assert names == ["get_weather"] and json.loads(arguments) == {"city": "Paris"}
    assert finishes == ["tool_calls"]


def test_a_call_cut_short_is_text(hermes: ServerThread) -> None:
    say(hermes, CALL)
    out = _client(hermes).chat.completions.create(
        model=hermes.engine.model_name,
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=6,  # type: ignore[arg-type]
    )
    assert out.choices[0].finish_reason == "length"
    assert out.choices[0].message.tool_calls is None
    assert (out.choices[0].message.content or "").startswith("<tool_call>")


def test_auto_without_a_template_format_is_a_400(server: ServerThread) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _client(server).chat.completions.create(
            model=server.engine.model_name,
            messages=MESSAGES,
            tools=TOOLS,
            max_tokens=4,  # type: ignore[arg-type]
        )
    assert info.value.body["param"] == "tool_choice", info.value.body  # type: ignore[index]
    assert "<tool_call>" in info.value.body["message"]  # type: ignore[index]


def test_a_server_chat_template_reaches_engine_and_gateway(make_server) -> None:  # type: ignore[no-untyped-def]
    """EngineConfig.chat_template on the default model: the engine renders with it (the
    prompt's length) and the gateway sees it (tool_choice "auto" is served)."""
    srv = make_server(BASE_CONFIG.replace(chat_template=HERMES_TEMPLATE))
    tokenizer = srv.engine.tokenizer
    out = _client(srv).chat.completions.create(
        model=srv.engine.model_name,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=2,
    )
    rendered = tokenizer.render_chat(MESSAGES, tools=TOOLS)
    assert rendered.startswith("<|im_start|>system\nYou may call these functions:")
    assert out.usage is not None
    assert out.usage.prompt_tokens == len(tokenizer.encode(rendered, False))
