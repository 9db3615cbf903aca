"""Tool calls through the official `openai` client: tool_choice "required" and a named function,
whole and streamed, parse into the client's objects and follow the function's schema; "auto"
and bad tool fields are 400s naming the field (fake runner, its tokens bent to the grammar)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS: Any = [
    {"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "time", "parameters": TIME}},
]
SCHEMAS = {"weather": WEATHER, "time": TIME}
MESSAGES: Any = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _check(calls: Any) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "weather"}}]
)
def test_tool_calls_whole_and_streamed(client: OpenAI, tool_choice: Any) -> None:
    kw: Any = {"model": "", "messages": MESSAGES, "tools": TOOLS, "tool_choice": tool_choice}
    kw.update(max_tokens=64, temperature=1.0, seed=7)
    out = client.chat.completions.create(**kw)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    _check(choice.message.tool_calls)
    if isinstance(tool_choice, dict):
        assert [c.function.name for c in choice.message.tool_calls or []] == ["weather"]
    chunks = list(client.chat.completions.create(**kw, stream=True))
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function and delta.function.name:
                entry["name"] = delta.function.name
            if delta.function and delta.function.arguments:
                entry["arguments"] += delta.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    whole = [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []
    ]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == whole


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"tools": TOOLS}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "required"}, "tools"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
    ],
)
def test_bad_tool_fields_are_400_naming_the_field(
    client: OpenAI, kw: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="", messages=MESSAGES, max_tokens=8, **kw)
    body: Any = info.value.body
    assert body["param"] == param, body


def test_tool_choice_none_answers_in_text(client: OpenAI) -> None:
    out = client.chat.completions.create(
        model="", messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=4
    )
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content
