"""gateway/tool_auto.py: Hermes tool calls parsed out of text, whole and streamed (content
held back from the first `<tool_call>`, split anywhere), and what stays plain text."""

from __future__ import annotations

import json

import pytest
from troupe.gateway.tool_auto import TOOL_PARSERS, AutoToolStream, parse_calls, template_tool_parser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO = (
    CALL + '\n<tool_call>\n{"name": "get_time", "arguments": "{\\"tz\\": \\"CET\\"}"}\n</tool_call>'
)
NAMES = ("get_weather", "get_time")


def _calls(calls: list[dict]) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_parse_calls() -> None:
    content, calls = parse_calls("Let me check.\n" + CALL, NAMES)
    assert content == "Let me check." and _calls(calls) == [("get_weather", {"city": "Paris"})]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    content, calls = parse_calls(TWO, NAMES)
    assert content is None
    assert _calls(calls) == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]


@pytest.mark.parametrize(
    "text",
    [
        "no calls here",
        CALL.replace("get_weather", "launch_rockets"),  # not one of the tools
        CALL.replace('{"city"', "{city"),  # not JSON
        CALL + '\n<tool_call>\n{"name": "get_time"',  # cut short: a tag left open
        CALL.replace("</tool_call>", ""),
    ],
)
def test_what_does_not_parse_is_text(text: str) -> None:
    assert parse_calls(text, NAMES) == (text, [])


def test_template_detection() -> None:
    """The format is the one the template writes calls in: GLM's and Qwen3-Coder's sit inside
    Hermes's tags, so theirs win, and Seed-OSS's functions in its own; a template with no
    format troupe reads gets None."""
    assert template_tool_parser("...{{ '<tool_call>' }}...") == "hermes"
    glm = "<tool_call>{{ tc.name }}\n<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>"
    assert template_tool_parser(glm) == "glm45"
    qwen_coder = "<tool_call>\n<function={{ tc.name }}>\n<parameter={{ k }}>"
    assert template_tool_parser(qwen_coder) == "qwen3_coder"
    kimi = "<|tool_calls_section_begin|><|tool_call_begin|>{{ id }}<|tool_call_argument_begin|>"
    assert template_tool_parser(kimi) == "kimi_k2"
    assert template_tool_parser('<minimax:tool_call>\n<invoke name="{{ n }}">') == "minimax_m2"
    seed = "<seed:tool_call>\n<function={{ tc.name }}>\n<parameter={{ k }}>"  # Seed-OSS's
    assert template_tool_parser(seed) == "seed_oss"
    hunyuan = "<answer>\n<tool_calls>{{ message.tool_calls | tojson }}</tool_calls>"  # A13B's
    assert template_tool_parser(hunyuan) == "hunyuan_a13b"
    assert template_tool_parser("{{ messages }}") is None and template_tool_parser(None) is None


@pytest.mark.parametrize("size", [1, 2, 3, 5, 11, 1000])
def test_stream_holds_back_from_the_tag(size: int) -> None:
    text = "Let me check.\n" + CALL
    stream = AutoToolStream(NAMES)
    sent = "".join(stream.delta(text[i : i + size]) for i in range(0, len(text), size))
    assert sent == "Let me check.\n"  # nothing of the tag went out as content
    rest, calls = stream.finish(stopped=True)
    assert rest == "" and _calls(calls) == [("get_weather", {"city": "Paris"})]


def test_stream_gives_the_held_text_back_when_no_call_parses() -> None:
    for stopped, text in ((False, 'Hi <tool_call>\n{"name": "get_weather"'), (True, "a <tool_c")):
        stream = AutoToolStream(NAMES)
        sent = stream.delta(text)
        rest, calls = stream.finish(stopped=stopped)
        assert sent + rest == text and calls == []
    plain = AutoToolStream(NAMES)
    assert plain.delta("a < b") == "a < b"  # "<" alone is held only while it could be a tag


def test_parser_names_listed() -> None:
    assert set(TOOL_PARSERS) >= {"mistral", "pythonic", "qwen3_coder", "deepseek_v3", "granite"}
    assert {"kimi_k2", "glm45"} <= set(TOOL_PARSERS)


def test_an_unknown_parser_is_refused_naming_the_choices() -> None:
    from troupe.config import ConfigError
    from troupe.gateway.state import GatewaySettings

    with pytest.raises(ConfigError, match=r"tool_call_parser must be one of .*qwen3_coder"):
        GatewaySettings(tool_call_parser="xlam")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"reasoning_parser must be one of .*mistral, granite"):
        GatewaySettings(reasoning_parser="gpt_oss")  # type: ignore[arg-type]
