"""An agent's turn (assistant tool calls with null content, tool results) renders exactly as
transformers' apply_chat_template renders the dicts vLLM hands it, on Qwen2.5's and Llama
3.1's real templates (tests/fixtures/chat_templates); the engine's edge takes the messages as
OpenAI dicts or ChatMessages and names the field of a bad one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from troupe.actors.core.chat_messages import (
    ChatMessageError,
    check_chat_messages,
    template_messages,
)
from troupe.actors.core.chat_template import ChatTemplate, ChatTemplateError
from troupe.actors.request_input import RequestInputError, to_generate_request
from troupe.messages import ChatMessage, ChatPrompt, ToolCall, ToolCallFunction

TEMPLATES = Path(__file__).parents[2] / "fixtures" / "chat_templates"
QWEN = (TEMPLATES / "qwen2.5-instruct.jinja").read_text()
LLAMA = (TEMPLATES / "llama3.1-instruct.jinja").read_text()
SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def _tool(name: str, argument: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name.removeprefix('get_')} at a place",
            "parameters": {
                "type": "object",
                "properties": {argument: {"type": "string"}},
                "required": [argument],
            },
        },
    }


TOOLS = [_tool("get_weather", "city"), _tool("get_time", "tz")]


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# One full agent turn, as an OpenAI client sends it.
TURN: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            _call("call_1", "get_weather", '{"city": "Paris"}'),
            _call("call_2", "get_time", '{"tz": "Europe/Paris", "note": "été <&>"}'),
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
]


def vllm_dicts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The client's dicts with each call's arguments parsed, as vLLM hands them to HF."""
    out = json.loads(json.dumps(messages))
    for message in out:
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def hf_render(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    chat_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = chat_utils.render_jinja_template(
        conversations=[messages], chat_template=template, **SPECIAL, **kwargs
    )
    return str(rendered[0])


def _troupe(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """The engine's path: its edge (OpenAI dicts -> ChatMessages), then the template."""
    request = to_generate_request("r", messages, None, 0.0)
    assert request.messages is not None
    return ChatTemplate(template, special_tokens=SPECIAL).render(
        template_messages(request.messages), **kwargs
    )


@pytest.mark.parametrize("tools", [TOOLS, None])
def test_qwen_renders_an_agent_turn_as_transformers(tools: Any) -> None:
    got = _troupe(QWEN, TURN, tools=tools)
    want = hf_render(QWEN, vllm_dicts(TURN), tools=tools, add_generation_prompt=True)
    assert got == want
    # what the template made of it: both calls, their arguments as JSON, the results
    assert got.endswith(
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_time", "arguments": {"tz": "Europe/Paris", "note": "été <&>"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nSunny, 24 C\n"
        "</tool_response>\n<tool_response>\n14:05\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert ('"name": "get_time"' in got.split("<|im_end|>")[0]) == (tools is not None)


def test_qwen_renders_text_beside_calls_and_a_final_answer() -> None:
    turn = [*TURN[:2], {**TURN[2], "content": "Checking."}, *TURN[3:]]
    answered = [*turn, {"role": "assistant", "content": "Sunny, 14:05."}]
    for messages, add in ((turn, True), (answered, False)):
        got = _troupe(QWEN, messages, tools=TOOLS, add_generation_prompt=add)
        assert got == hf_render(QWEN, vllm_dicts(messages), tools=TOOLS, add_generation_prompt=add)
    assert "<|im_start|>assistant\nChecking.\n<tool_call>" in got


def test_llama31_renders_calls_one_per_turn_as_transformers() -> None:
    # Llama 3.1 takes one call per assistant message, and tests `'tool_calls' in message`:
    # a plain answer rendered with a None `tool_calls` key would take the call path
    messages = [
        *TURN[:2],
        {**TURN[2], "tool_calls": TURN[2]["tool_calls"][:1]},
        TURN[3],
        {"role": "assistant", "content": "It is sunny. Now the time."},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "tool_calls": TURN[2]["tool_calls"][1:]},  # content left out
        TURN[4],
    ]
    for tools in (TOOLS, None):
        got = _troupe(LLAMA, messages, tools=tools)
        assert got == hf_render(
            LLAMA, vllm_dicts(messages), tools=tools, add_generation_prompt=True
        )
    assert (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", '
        '"parameters": {"city": "Paris"}}<|eot_id|>'
    ) in got
    assert "<|start_header_id|>assistant<|end_header_id|>\n\nIt is sunny." in got
    with pytest.raises(ChatTemplateError, match="only supports single tool-calls"):
        _troupe(LLAMA, TURN)


def test_the_template_sees_only_the_keys_the_client_sent() -> None:
    messages = [
        ChatMessage(role="user", content="Hi", name="ann"),
        ChatMessage(role="assistant", content="Hello."),
        ChatMessage(role="assistant", content="x", tool_calls=()),  # empty: the plain path
        ChatMessage(
            role="assistant",
            tool_calls=(ToolCall(id="c", function=ToolCallFunction(name="f", arguments="")),),
            reasoning="Think.",
        ),
        ChatMessage(role="tool", content="ok", tool_call_id="c"),
    ]
    assert template_messages(messages) == [
        {"role": "user", "content": "Hi", "name": "ann"},
        {"role": "assistant", "content": "Hello."},
        {"role": "assistant", "content": "x"},
        {
            "role": "assistant",
            "content": "",  # vLLM's: a null content renders as ""
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}],
            "reasoning": "Think.",
            "reasoning_content": "Think.",
            "thinking": "Think.",  # GPT-OSS's template reads this name
        },
        {"role": "tool", "content": "ok", "tool_call_id": "c"},
    ]  # fmt: skip
    probe = (
        "{% for m in messages %}{{ 'tool_calls' in m }}{{ m.tool_calls is defined }} {% endfor %}"
    )
    rendered = ChatTemplate(probe).render(template_messages(messages), add_generation_prompt=False)
    assert rendered == "FalseFalse FalseFalse FalseFalse TrueTrue FalseFalse "


def test_chat_message_stays_backward_compatible() -> None:
    old = ChatMessage(role="user", content="hi")
    assert msgspec.json.encode(old) == b'{"role":"user","content":"hi"}'  # as before
    assert msgspec.json.decode(b'{"role":"user","content":"hi"}', type=ChatMessage) == old
    call = ToolCall(id="c", function=ToolCallFunction(name="f", arguments='{"a": 1}'))
    message = ChatMessage(role="assistant", tool_calls=(call,))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(message), type=ChatMessage) == message


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": None}], "messages[0].content"),
        ([{"role": "assistant", "content": None, "tool_calls": []}], "messages[0].content"),
        ([{"role": "user", "content": "x", "tool_calls": [_call("c", "f", "{}")]}], "messages[0].tool_calls"),
        ([{"role": "user", "content": "x", "tool_call_id": "c"}], "messages[0].tool_call_id"),
        ([TURN[1], {"role": "assistant", "tool_calls": [_call("c", "f", "{")]}], "messages[1].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "tool_calls": [_call("c", "f", "{}"), _call("d", "g", "[1]")]}], "messages[0].tool_calls[1].function.arguments"),
        ([{"role": "assistant", "tool_calls": [_call("c", "f", '"text"')]}], "messages[0].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}], "messages[0].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}], "messages[0].tool_calls[0].id"),
        ([{"role": "assistant", "tool_calls": [{**_call("c", "f", "{}"), "type": "code"}]}], "messages[0].tool_calls[0].type"),
        ([{"role": "assistant", "tool_calls": [{**_call("c", "f", "{}"), "index": 0}]}], "messages[0].tool_calls[0].index"),
        ([{"role": "assistant", "tool_calls": [_call("c", "f", 7)]}], "messages[0].tool_calls[0].function.arguments"),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_the_engine_edge_names_the_bad_field(messages: list[Any], field: str) -> None:
    with pytest.raises(RequestInputError) as info:
        to_generate_request("r", messages, None, 0.0)
    assert info.value.field == field
    assert field in str(info.value)


def test_built_messages_are_checked_too() -> None:
    bad = ChatMessage(
        role="assistant",
        tool_calls=(ToolCall(id="c", function=ToolCallFunction(name="f", arguments="nope")),),
    )
    with pytest.raises(ChatMessageError, match=r"messages\[1\]\.tool_calls\[0\]\.function"):
        check_chat_messages([ChatMessage(role="user", content="x"), bad])
    for prompt in ([bad], ChatPrompt(messages=(bad,))):
        with pytest.raises(RequestInputError) as info:
            to_generate_request("r", prompt, None, 0.0)
        assert info.value.field == "messages[0].tool_calls[0].function.arguments"
    with pytest.raises(RequestInputError, match="content is missing"):
        to_generate_request("r", [ChatMessage(role="user")], None, 0.0)
