"""tool_choice "auto" with `--tool-call-parser llama3_json` over HTTP with the official `openai`
client, on a Llama-3.1-style template (the tools as JSON in the system message; SmolLM2's
tokenizer, a fake runner made to say exact replies): JSON calls (after `<|python_tag|>` or not,
several joined by `;`) come back as `tool_calls`, whole and streamed alike; plain text and
malformed JSON stay text; without the setting "auto" on this template is a 400."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
from openai import OpenAI
from troupe.config import ConfigError
from troupe.gateway.server import add_serve_arguments
from troupe.gateway.settings import settings_from_args
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import BASE_CONFIG, ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model
from tests.gateway.tool_specs import function_tool

LLAMA_TEMPLATE = """\
{%- if tools %}<|im_start|>system
Environment: ipython
Given the following functions, respond with a JSON for a function call with its proper \
arguments that best answers the given prompt. Respond in the format {"name": function name, \
"parameters": dictionary of argument name and its value}. Do not use variables.
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


TOOLS = [
    function_tool("get_weather", {"city": {"type": "string"}}, ["city"]),
    function_tool("get_time", {"tz": {"type": "string"}}, ["tz"]),
]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
TIME = '{"name": "get_time", "arguments": {"tz": "CET"}}'


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return template_model(tmp_path_factory.mktemp("llama3-model"), LLAMA_TEMPLATE)


@pytest.fixture(scope="module")
def llama(llama_model: Path) -> Iterator[ServerThread]:
    srv = scripted_server(llama_model, GatewaySettings(tool_call_parser="llama3_json")).start()
    yield srv
    srv.shutdown()


def _client(server: ServerThread) -> OpenAI:
    return openai_client(server.url)


def _whole(server: ServerThread, text: str) -> tuple[str | None, list[tuple[str, Any]], str]:
    """(content, [(name, arguments)], finish_reason) of the reply `text`, not streamed."""
    say(server, text)
    out = _client(server).chat.completions.create(
        model=server.engine.model_name,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=96,
    )
    choice = out.choices[0]
    calls = [
        (c.function.name, json.loads(c.function.arguments))  # type: ignore[union-attr]
        for c in choice.message.tool_calls or ()
    ]
    for c in choice.message.tool_calls or ():
        assert c.id.startswith("call_") and c.type == "function"
    return choice.message.content, calls, choice.finish_reason


def _streamed(server: ServerThread, text: str) -> tuple[str | None, list[tuple[str, Any]], str]:
    """The same, streamed: the content and the calls put together from the deltas."""
    say(server, text)
    content, finishes = "", []
    calls: dict[int, list[Any]] = {}
    for chunk in _client(server).chat.completions.create(
        model=server.engine.model_name,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=96,
        stream=True,
    ):
        for c in chunk.choices:
            content += c.delta.content or ""
            for call in c.delta.tool_calls or ():
                assert call.function is not None
                entry = calls.setdefault(call.index, [None, ""])
                entry[0] = entry[0] or call.function.name
                entry[1] += call.function.arguments or ""
            if c.finish_reason:
                finishes.append(c.finish_reason)
    assert len(finishes) == 1, finishes
    found = [(name, json.loads(args)) for name, args in (calls[i] for i in sorted(calls))]
    return content or None, found, finishes[0]


def _both(server: ServerThread, text: str) -> tuple[str | None, list[tuple[str, Any]], str]:
    whole = _whole(server, text)
    assert _streamed(server, text) == whole
    return whole


def test_the_tools_reach_the_prompt(llama: ServerThread) -> None:
    say(llama, "Sunny.")
    out = _client(llama).chat.completions.create(
        model=llama.engine.model_name,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=8,
    )
    rendered = llama.engine.tokenizer.render_chat(MESSAGES, tools=TOOLS)
    assert "Environment: ipython" in rendered and '"name": "get_time"' in rendered
    assert out.usage is not None
    assert out.usage.prompt_tokens == len(llama.engine.tokenizer.encode(rendered, False))


def test_tokenize_renders_the_tools_as_chat_does(llama: ServerThread) -> None:
    """vLLM's /tokenize takes the tools too: its count is what a chat with them runs."""
    say(llama, "Sunny.")
    client = _client(llama)
    out = client.chat.completions.create(
        model=llama.engine.model_name,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=8,
        extra_body={"return_token_ids": True},
    )
    ran = (out.model_extra or {})["prompt_token_ids"]
    tokens = client.post("/tokenize", cast_to=object, body={"messages": MESSAGES, "tools": TOOLS})
    assert isinstance(tokens, dict) and tokens["tokens"] == ran
    bare = client.post("/tokenize", cast_to=object, body={"messages": MESSAGES})
    assert isinstance(bare, dict) and bare["count"] < len(ran)


def test_one_call(llama: ServerThread) -> None:
    assert _both(llama, WEATHER) == (None, [("get_weather", {"city": "Paris"})], "tool_calls")


def test_two_calls_joined_by_a_semicolon(llama: ServerThread) -> None:
    want = [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
    assert _both(llama, f"{WEATHER}; {TIME}") == (None, want, "tool_calls")


def test_the_python_tag_opens_a_call(llama: ServerThread) -> None:
    want = (None, [("get_time", {"tz": "CET"})], "tool_calls")
    assert _both(llama, "<|python_tag|>" + TIME) == want


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Paris.",
        '{"name": "get_weather", "city": "Paris"}',  # neither arguments nor parameters
        '{"name": "get_news", "parameters": {}}',  # no such tool
        f"Let me check: {WEATHER}",  # text first: not a call (as vLLM streams it)
    ],
)
def test_other_replies_stay_text(llama: ServerThread, text: str) -> None:
    assert _both(llama, text) == (text, [], "stop")


@pytest.mark.parametrize("text", [WEATHER[:-1], f"{WEATHER} and more"])  # never closed; text after
def test_a_call_gone_out_before_the_reply_goes_wrong_stays_a_call(
    llama: ServerThread, text: str
) -> None:
    """Whole, text; streamed, the call went out as it was written, so the stream ends with
    it and finish_reason "stop" (not "tool_calls": the reply did not parse), its text never
    sent again as content (gateway/tool_stream.py)."""
    assert _whole(llama, text) == (text, [], "stop")
    assert _streamed(llama, text) == (None, [("get_weather", {"city": "Paris"})], "stop")


def test_without_the_setting_auto_is_a_400(make_server: Any, llama_model: Path) -> None:
    srv = make_server(BASE_CONFIG.replace(model=str(llama_model)))
    with pytest.raises(openai.BadRequestError) as info:
        _client(srv).chat.completions.create(
            model=srv.engine.model_name,
            messages=MESSAGES,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            max_tokens=4,
        )
    assert info.value.body["param"] == "tool_choice", info.value.body  # type: ignore[index]
    assert "--tool-call-parser" in info.value.body["message"]  # type: ignore[index]


def test_the_flag() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert settings_from_args(parser.parse_args([])).tool_call_parser is None
    args = parser.parse_args(["--tool-call-parser", "llama3_json"])
    assert settings_from_args(args).tool_call_parser == "llama3_json"
    with pytest.raises(SystemExit):
        parser.parse_args(["--tool-call-parser", "xlam"])
    with pytest.raises(ConfigError, match="tool_call_parser"):
        GatewaySettings(tool_call_parser="xlam")  # type: ignore[arg-type]


def test_enable_auto_tool_choice_as_vllm_spells_it() -> None:
    """vLLM's `--enable-auto-tool-choice` is taken (on by default here); turned off, "auto"
    reads no format whatever the parser or template, and the 400 names the flag."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
    on = settings_from_args(parser.parse_args(args))
    assert on.enable_auto_tool_choice and on.auto_tool_parser(None) == "llama3_json"
    off = settings_from_args(parser.parse_args([*args[1:], "--no-enable-auto-tool-choice"]))
    assert off.auto_tool_parser(None) is None
    assert off.auto_tool_parser("{{ '<tool_call>' }}") is None
    assert GatewaySettings().auto_tool_parser("{{ '<tool_call>' }}") == "hermes"
    from troupe.gateway.errors import ApiError
    from troupe.gateway.tool_calls import Tool, tool_plan

    with pytest.raises(ApiError, match="--enable-auto-tool-choice") as info:
        tool_plan(msgspec.convert(TOOLS, list[Tool]), None, None, tool_parser=None)
    assert info.value.param == "tool_choice"
