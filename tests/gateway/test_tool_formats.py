"""The tool-call parsers read through gateway/tool_format.py (mistral, pythonic, qwen3_coder,
deepseek_v3, deepseek_v31, granite, kimi_k2, glm45, minimax_m2, hunyuan_a13b, openai): whole replies against
vLLM's answers on the same text, and each reply streamed cut at every point (and character by
character) giving the same content and calls."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from troupe.gateway.tool_auto import auto_tool_stream, parse_auto_calls
from troupe.gateway.tool_qwen3_coder import typed_value

from tests.gateway.tool_specs import function_tool

TOOLS = [
    function_tool(
        "get_weather",
        {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "hot": {"type": "boolean"},
            "ratio": {"type": "number"},
            "opts": {"type": "object"},
            "tags": {"type": ["array", "null"]},
        },
    ),
    function_tool("get_time"),
]
Calls = list[tuple[str, Any]]
PARIS = ("get_weather", {"city": "Paris"})
DS_WEATHER = (
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜>'
)
DS_TIME = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
GRANITE_PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
KIMI_PARIS = (
    "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris"}<|tool_call_end|>'
)
GLM_PARIS = (
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
)
HARMONY = "<|start|>assistant to=functions.{}<|channel|>commentary json<|message|>{}<|call|>"
QWEN_PARIS = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>"
)

CASES: list[tuple[str, str, str | None, Calls]] = [
    # mistral: the JSON array after [TOOL_CALLS] (7B v0.3, Nemo)
    (
        "mistral",
        'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "Sure. ",
        [PARIS],
    ),
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city":"Paris"}, "id": "a1b2c3d4e"},'
        ' {"name": "get_time", "arguments": {}}]',
        None,
        [PARIS, ("get_time", {})],
    ),
    # mistral: name[ARGS]{...} per call (Small 3.2+), with [CALL_ID], and v11's name{...}
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
        None,
        [PARIS, ("get_time", {})],
    ),
    ("mistral", '[TOOL_CALLS]get_weather[CALL_ID]x1[ARGS]{"city": "Paris"}', None, [PARIS]),
    ("mistral", '[TOOL_CALLS]get_weather{"city": "Paris"}', None, [PARIS]),
    ("mistral", "No calls, a [TOOL bracket", "No calls, a [TOOL bracket", []),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": ', None, []),  # cut: text
    ("mistral", "[TOOL_CALLS]nope[ARGS]{}", None, []),  # an unknown tool: text
    ("mistral", "[TOOL_CALLS]get_time[ARGS][1]", None, []),  # arguments not an object
    # pythonic (Llama 3.2 / 4)
    (
        "pythonic",
        '[get_weather(city="Paris", days=-3, hot=True, tags=None), get_time()]',
        None,
        [
            ("get_weather", {"city": "Paris", "days": -3, "hot": True, "tags": None}),
            ("get_time", {}),
        ],
    ),
    ("pythonic", ' \n[get_weather(city="Paris")]', None, [PARIS]),
    (
        "pythonic",
        "[get_weather(opts={'a': [1, 2.5]}, city='Paris')]",
        None,
        [("get_weather", {"opts": {"a": [1, 2.5]}, "city": "Paris"})],
    ),
    ("pythonic", '<|python_start|>[get_weather(city="Paris")]<|python_end|>', None, [PARIS]),
    ("pythonic", '[get_weather("Paris")]', None, []),  # positional: text
    ("pythonic", "[1, 2, 3] are numbers", None, []),
    ("pythonic", "[]", None, []),
    ("pythonic", "[get_weather(city=__import__('os'))]", None, []),  # never evaluated
    ("pythonic", 'I would call [get_weather(city="Paris")]', None, []),  # not leading
    ("pythonic", "[note] plain text", None, []),
    # qwen3_coder: values typed by the schema
    (
        "qwen3_coder",
        "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=hot>\nTrue\n"
        "</parameter>\n<parameter=ratio>\n2.0\n</parameter>\n<parameter=opts>\n"
        '{"a": 1}\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n'
        "</tool_call>",
        "Let me check.\n",
        [
            (
                "get_weather",
                {"city": "Paris", "days": 3, "hot": True, "ratio": 2, "opts": {"a": 1}}
                | {"extra": "7"},  # not in the schema: a string
            )
        ],
    ),
    ("qwen3_coder", QWEN_PARIS + "\n" + QWEN_PARIS, None, [PARIS, PARIS]),
    ("qwen3_coder", "<function=get_time>\n</function>", None, [("get_time", {})]),
    # lenient where the model stopped, as vLLM's
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", None, [PARIS]),
    ("qwen3_coder", "<tool_call>\n<function=nope>\n</function>\n</tool_call>", None, []),
    ("qwen3_coder", "Only <tool_call> talk", "Only ", []),
    ("qwen3_coder", "a < b, <functional", "a < b, <functional", []),
    # seed_oss: Qwen3-Coder's functions in Seed-OSS's wrapper
    ("seed_oss", QWEN_PARIS.replace("tool_call>", "seed:tool_call>"), None, [PARIS]),
    ("seed_oss", "Hm.\n<function=get_time>\n</function>", "Hm.\n", [("get_time", {})]),
    (
        "seed_oss",
        "<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nParis",
        None,
        [PARIS],
    ),
    ("seed_oss", "Only <seed:tool_call> talk", "Only ", []),
    # deepseek_v3
    (
        "deepseek_v3",
        f"Checking.<｜tool▁calls▁begin｜>{DS_WEATHER}\n{DS_TIME}<｜tool▁calls▁end｜>",
        "Checking.",
        [PARIS, ("get_time", {})],
    ),
    (
        "deepseek_v3",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{\n  "city": "Paris"\n}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        None,
        [PARIS],
    ),
    (
        "deepseek_v3",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": \n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        None,
        [],
    ),
    ("deepseek_v3", "<｜tool▁calls▁begin｜>" + DS_WEATHER[:-10], None, []),  # cut short
    # deepseek_v31: name<｜tool▁sep｜>{...}, no kind, no fence
    (
        "deepseek_v31",
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "Checking.",
        [PARIS, ("get_time", {})],
    ),
    ("deepseek_v31", "<｜tool▁calls▁begin｜>" + DS_WEATHER, None, []),  # V3's form is not V3.1's
    (
        "deepseek_v31",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Par',
        None,
        [],
    ),
    # granite: the reply opens with the array (after <|tool_call|>, <tool_call> or nothing)
    ("granite", f"<|tool_call|>[{GRANITE_PARIS}]", None, [PARIS]),
    (
        "granite",
        f'<tool_call> [{GRANITE_PARIS}, {{"name": "get_time"}}]',
        None,
        [PARIS, ("get_time", {})],
    ),
    ("granite", f"\n[{GRANITE_PARIS}]\n", None, [PARIS]),
    ("granite", f"Sure: <|tool_call|>[{GRANITE_PARIS}]", None, []),  # not where it opens
    ("granite", '<|tool_call|>[{"name": "nope", "arguments": {}}]', None, []),
    ("granite", f"<|tool_call|>[{GRANITE_PARIS}", None, []),  # cut short
    ("granite", f"<|tool_call|>[{GRANITE_PARIS}] and more", None, []),
    # hunyuan_a13b: the array between <tool_calls> tags, after any content
    ("hunyuan_a13b", f"<tool_calls>[{GRANITE_PARIS}]</tool_calls>", None, [PARIS]),
    (
        "hunyuan_a13b",
        f'Checking.\n<tool_calls>[{GRANITE_PARIS}, {{"name": "get_time", "arguments": {{}}}}]'
        "</tool_calls>\n",
        "Checking.\n",
        [PARIS, ("get_time", {})],
    ),
    ("hunyuan_a13b", f"<tool_calls>[{GRANITE_PARIS}]", None, []),  # left open
    ("hunyuan_a13b", f"<tool_calls>[{GRANITE_PARIS}]</tool_calls> more", None, []),
    ("hunyuan_a13b", '<tool_calls>[{"name": "nope", "arguments": {}}]</tool_calls>', None, []),
    ("hunyuan_a13b", "a <tool_call> b", "a <tool_call> b", []),
    # kimi_k2: the model's own ids, the name after `functions.`
    (
        "kimi_k2",
        f"Checking.<|tool_calls_section_begin|>\n{KIMI_PARIS}\n<|tool_call_begin|>get_time:1"
        "<|tool_call_argument_begin|> {} <|tool_call_end|>\n<|tool_calls_section_end|>",
        "Checking.",
        [PARIS, ("get_time", {})],
    ),
    ("kimi_k2", f"<|tool_calls_section_begin|>{KIMI_PARIS[:-20]}", None, []),  # cut short
    (
        "kimi_k2",
        "<|tool_calls_section_begin|>" + KIMI_PARIS.replace(":0", ""),
        None,
        [],
    ),  # no index
    ("kimi_k2", "<|tool_calls_section_begin|>" + KIMI_PARIS.replace("weather", "news"), None, []),
    ("kimi_k2", "<|tool_calls_section_begin|>" + KIMI_PARIS.replace("{", "[{"), None, []),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_calls_section_end|>", None, []),
    # glm45: pairs typed by the schema (strings as written), GLM-4.7 without newlines
    (
        "glm45",
        "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>"
        " 12 </arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>hot"
        "</arg_key>\n<arg_value>true</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>"
        "{'a': (1, 2)}</arg_value>\n<arg_key>extra</arg_key>\n<arg_value>seven</arg_value>\n"
        "</tool_call>\nand after",
        "Let me check.\n",
        [
            (
                "get_weather",
                {"city": "12", "days": 3, "hot": True, "opts": {"a": [1, 2]}, "extra": "seven"},
            )
        ],
    ),
    (
        "glm45",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
        "<tool_call>get_time</tool_call>",
        None,
        [PARIS, ("get_time", {})],
    ),
    ("glm45", GLM_PARIS[:-12], None, []),  # cut short
    ("glm45", GLM_PARIS.replace("get_weather", "get_news"), None, []),
    ("glm45", "Only <tool_call> talk", None, []),
    ("glm45", "a <tool_cal", None, []),
    # minimax_m2: invokes in blocks, values typed by the schema, names quoted or bare
    (
        "minimax_m2",
        'Checking.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">'
        'Paris</parameter>\n<parameter name="days">\n3\n</parameter>\n<parameter name=hot>'
        "true</parameter>\n</invoke>\n<invoke name='get_time'>\n</invoke>\n"
        "</minimax:tool_call>",
        "Checking.\n",
        [("get_weather", {"city": "Paris", "days": 3, "hot": True}), ("get_time", {})],
    ),
    (
        "minimax_m2",
        '<minimax:tool_call><invoke name="get_weather"><parameter name="city">Paris',
        None,
        [],
    ),  # cut short
    (
        "minimax_m2",
        '<minimax:tool_call><invoke name="get_news"></invoke></minimax:tool_call>',
        None,
        [],
    ),
    # openai: GPT-OSS's calls as the harmony parser keeps them in the content
    (
        "openai",
        "Let me check."
        + HARMONY.format("get_weather", ' {"city": "Paris"}\n')
        + HARMONY.format("get_time", "{}")
        + "and after",
        "Let me check.",
        [PARIS, ("get_time", {})],
    ),
    ("openai", HARMONY.format("get_weather", '{"city": "Par'), None, []),  # no <|call|>: cut
    ("openai", HARMONY.format("get_news", "{}"), None, []),  # an unknown tool
    ("openai", HARMONY.format("get_time", "[1]"), None, []),  # arguments not an object
    ("openai", HARMONY.format("get_time", "{bad"), None, []),
]


def _fix(case: tuple[str, str, str | None, Calls]) -> tuple[str, str, str | None, Calls]:
    """Where a case expects no calls, the content is the whole text."""
    parser, text, content, calls = case
    if not calls:
        content = text
    return parser, text, content, [(name, dict(args)) for name, args in calls]


def _calls(found: list[dict[str, Any]]) -> Calls:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found]


def _streamed(parser: str, pieces: list[str]) -> tuple[str | None, list[dict[str, Any]]]:
    stream = auto_tool_stream(TOOLS, parser)  # type: ignore[arg-type]
    sent = "".join(stream.delta(p) for p in pieces)
    rest, found = stream.finish(True)
    return (sent + rest) or None, found


@pytest.mark.parametrize(("parser", "text", "content", "calls"), [_fix(c) for c in CASES])
def test_whole_reply(parser: str, text: str, content: str | None, calls: Calls) -> None:
    got_content, found = parse_auto_calls(text, TOOLS, parser)  # type: ignore[arg-type]
    assert (got_content, _calls(found)) == (content, calls)


@pytest.mark.parametrize(("parser", "text", "content", "calls"), [_fix(c) for c in CASES])
def test_streamed_at_every_split(parser: str, text: str, content: str | None, calls: Calls) -> None:
    whole_content, whole_calls = parse_auto_calls(text, TOOLS, parser)  # type: ignore[arg-type]
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        got_content, found = _streamed(parser, pieces)
        assert got_content == whole_content, pieces
        assert _calls(found) == _calls(whole_calls) == calls, pieces
        # the arguments are the whole reply's text, byte for byte (not just equal JSON)
        args = [c["function"]["arguments"] for c in found]
        assert args == [c["function"]["arguments"] for c in whole_calls], pieces


@pytest.mark.parametrize(
    ("parser", "text", "id_pattern"),
    [
        ("mistral", "[TOOL_CALLS]get_time[ARGS]{}", r"[A-Za-z0-9]{9}"),
        ("pythonic", "[get_time()]", r"chatcmpl-tool-[0-9a-f]{32}"),
        ("qwen3_coder", "<function=get_time></function>", r"call_[0-9a-f]{24}"),
        ("deepseek_v3", "<｜tool▁calls▁begin｜>" + DS_TIME, r"chatcmpl-tool-[0-9a-f]{32}"),
        ("granite", '<|tool_call|>[{"name": "get_time"}]', r"chatcmpl-tool-[0-9a-f]{32}"),
        (
            "hunyuan_a13b",
            '<tool_calls>[{"name": "get_time"}]</tool_calls>',
            r"chatcmpl-tool-[0-9a-f]{32}",
        ),
        ("kimi_k2", "<|tool_calls_section_begin|>" + KIMI_PARIS, r"functions\.get_weather:0"),
        (
            "deepseek_v31",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
            r"chatcmpl-tool-[0-9a-f]{32}",
        ),
        ("glm45", "<tool_call>get_time\n</tool_call>", r"chatcmpl-tool-[0-9a-f]{32}"),
        (
            "minimax_m2",
            '<minimax:tool_call><invoke name="get_time"></invoke></minimax:tool_call>',
            r"call_[0-9a-f]{24}",
        ),
        ("openai", HARMONY.format("get_time", "{}"), r"chatcmpl-tool-[0-9a-f]{32}"),
    ],
)
def test_ids_as_vllm_makes_them(parser: str, text: str, id_pattern: str) -> None:
    _, found = parse_auto_calls(text, TOOLS, parser)  # type: ignore[arg-type]
    assert len(found) == 1 and found[0]["type"] == "function"
    assert re.fullmatch(id_pattern, found[0]["id"]), found[0]["id"]


def test_content_goes_out_at_once_and_only_a_cut_marker_waits() -> None:
    stream = auto_tool_stream(TOOLS, "mistral")
    assert stream.delta("Let me look ") == "Let me look "
    assert stream.delta("[TOOL") == ""  # maybe [TOOL_CALLS]
    assert stream.delta("S] no") == "[TOOLS] no"
    assert stream.delta(" [TOOL_CALLS]get_time") == " "
    assert stream.delta("[ARGS]{}") == ""
    assert _calls(stream.finish(True)[1]) == [("get_time", {})]
    pythonic = auto_tool_stream(TOOLS, "pythonic")
    assert pythonic.delta("  ") == ""  # the reply may still open with [
    assert pythonic.delta("Hi") == "  Hi"
    assert pythonic.delta(" [x") == " [x"


def test_cut_short_is_text() -> None:
    """A reply max_tokens cut (not stopped) is its text, whatever it holds."""
    stream = auto_tool_stream(TOOLS, "deepseek_v3")
    text = f"Hm<｜tool▁calls▁begin｜>{DS_TIME}<｜tool▁calls▁end｜>"
    sent = stream.delta(text)
    assert sent == "Hm" and stream.finish(False) == (text[2:], [])


@pytest.mark.parametrize(
    ("raw", "schema", "value"),
    [
        ("12", {"type": "integer"}, 12),
        ("twelve", {"type": "integer"}, "twelve"),
        ("2.5", {"type": "number"}, 2.5),
        ("nan", {"type": "number"}, "nan"),  # no JSON form: the text
        ("FALSE", {"type": "boolean"}, False),
        ("null", {"type": "string"}, None),
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ("{'a': 1}", {"type": "object"}, {"a": 1}),  # a Python literal
        ("{1, 2}", {"type": "object"}, "{1, 2}"),  # a set has no JSON form
        ("12", None, "12"),  # a parameter the schema does not list
        ("12", {"description": "no type"}, "12"),
        ("5", {"type": ["integer", "null"]}, 5),
    ],
)
def test_qwen3_coder_values_typed_by_schema(raw: str, schema: Any, value: Any) -> None:
    assert typed_value(raw, schema) == value
