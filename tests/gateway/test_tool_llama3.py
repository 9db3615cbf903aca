"""gateway/tool_llama3.py: Llama 3.x JSON tool calls parsed out of text, whole and streamed
(text that cannot be a call goes out as it comes; a reply that may be one waits for the end),
and the parser the server picks for "auto"."""

from __future__ import annotations

import json

import pytest
from troupe.gateway.tool_auto import auto_tool_parser
from troupe.gateway.tool_llama3 import Llama3ToolStream, parse_llama3_calls

NAMES = ("get_weather", "get_time")
WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
TIME = '{"name": "get_time", "arguments": "{\\"tz\\": \\"CET\\"}"}'


def _calls(calls: list[dict]) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_parse() -> None:
    content, calls = parse_llama3_calls(f"\n<|python_tag|>{WEATHER} ;\n{TIME};", NAMES)
    assert content is None
    assert _calls(calls) == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]
    assert calls[0]["id"] != calls[1]["id"] and calls[0]["id"].startswith("call_")
    both = '{"name": "get_time", "arguments": {"tz": "CET"}, "parameters": {"tz": "UTC"}}'
    assert _calls(parse_llama3_calls(both, NAMES)[1]) == [("get_time", {"tz": "CET"})]


@pytest.mark.parametrize(
    "text", ["", "Sunny.", "{", "{}", f"{WEATHER};;", f"{WEATHER} {TIME}", "[" + WEATHER + "]"]
)
def test_what_stays_text(text: str) -> None:
    assert parse_llama3_calls(text, NAMES) == (text, [])


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_stream(size: int) -> None:
    text = "<|python_tag|>" + WEATHER
    stream = Llama3ToolStream(NAMES)
    sent = [stream.delta(text[i : i + size]) for i in range(0, len(text), size)]
    assert "".join(sent) == ""
    rest, calls = stream.finish(True)
    assert rest == "" and _calls(calls) == [("get_weather", {"city": "Paris"})]

    cut = Llama3ToolStream(NAMES)  # cut short by max_tokens: the text, no calls
    cut.delta(WEATHER)
    assert cut.finish(False) == (WEATHER, [])

    plain = Llama3ToolStream(NAMES)
    pieces = ["", " ", "<", "b>Hot", " today", "."]
    assert [plain.delta(p) for p in pieces] == ["", "", "", " <b>Hot", " today", "."]
    assert plain.finish(True) == ("", [])


def test_the_parser_for_auto() -> None:
    assert auto_tool_parser("llama3_json", None, None) == "llama3_json"
    assert auto_tool_parser("hermes", None, "{{ messages }}") == "hermes"
    assert auto_tool_parser(None, None, "{{ '<tool_call>' }}") == "hermes"
    assert auto_tool_parser(None, None, "{{ messages }}") is None
