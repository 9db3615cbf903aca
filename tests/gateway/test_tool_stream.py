"""gateway/tool_stream.py: tool_choice "auto" replies in every parser's format, cut into deltas
anywhere, stream each call as it is written and end as the whole reply's parse says: each
call's id and name once, before its arguments; its argument pieces put together parse to the
whole parse's arguments; content outside calls as content; a reply whose calls do not parse is
its text when no call went out, and never sends text twice when one did."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from troupe.gateway.tool_auto import TOOL_PARSERS, parse_auto_calls
from troupe.gateway.tool_deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, SEP
from troupe.gateway.tool_stream import (
    ArgumentsPiece,
    CallOpened,
    ContentPiece,
    StreamEnd,
    StreamPiece,
    streamed_calls,
)

from tests.gateway.tool_specs import function_tool

TOOLS = [
    function_tool(
        "get_weather",
        {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "hot": {"type": "boolean"},
            "opts": {"type": "object"},
            "tags": {"type": "array"},
        },
    ),
    function_tool("get_time", {"tz": {"type": "string"}}),
]
Call = tuple[str, dict[str, Any]]

# -- replies in each format -------------------------------------------------------------------


def _hermes(calls: list[Call], style: int) -> str:
    blocks = []
    for name, args in calls:
        value: Any = json.dumps(args) if style == 2 else args  # arguments as a JSON string
        body = json.dumps({"name": name, "arguments": value}, indent=2 if style == 1 else None)
        blocks.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(blocks)


def _llama3(calls: list[Call], style: int) -> str:
    key = "parameters" if style == 1 else "arguments"
    text = "; ".join(json.dumps({"name": n, key: a}, ensure_ascii=False) for n, a in calls)
    return ("<|python_tag|>" if style == 2 else "") + text


def _mistral(calls: list[Call], style: int) -> str:
    if style == 0:
        return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    return "".join(
        f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a, ensure_ascii=style == 1)}" for n, a in calls
    )


def _pythonic(calls: list[Call], style: int) -> str:
    def one(name: str, args: dict[str, Any]) -> str:
        return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"

    text = "[" + ", ".join(one(n, a) for n, a in calls) + "]"
    return f"<|python_start|>{text}<|python_end|>" if style == 1 else " \n" * style + text


def _qwen3_coder(calls: list[Call], style: int) -> str:
    def raw(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    functions = [
        f"<function={n}>\n"
        + "".join(f"<parameter={k}>\n{raw(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>"
        for n, a in calls
    ]
    if style == 1:  # no <tool_call> wrapper
        return "\n".join(functions)
    return "\n".join(f"<tool_call>\n{f}\n</tool_call>" for f in functions)


def _seed_oss(calls: list[Call], style: int) -> str:
    """Qwen3-Coder's functions in Seed-OSS's wrapper."""
    text = _qwen3_coder(calls, style)
    return text.replace("<tool_call>", "<seed:tool_call>").replace(
        "</tool_call>", "</seed:tool_call>"
    )


def _deepseek_v3(calls: list[Call], style: int) -> str:
    return (
        CALLS_BEGIN
        + "\n".join(
            f"{CALL_BEGIN}function{SEP}{n}\n```json\n"
            f"{json.dumps(a, indent=style or None)}\n```{CALL_END}"
            for n, a in calls
        )
        + "<｜tool▁calls▁end｜>"
    )


def _deepseek_v31(calls: list[Call], style: int) -> str:
    return (
        CALLS_BEGIN
        + "\n" * style
        + "".join(
            f"{CALL_BEGIN}{n}{SEP}{json.dumps(a, indent=style or None)}{CALL_END}" for n, a in calls
        )
        + "<｜tool▁calls▁end｜>"
    )


def _granite(calls: list[Call], style: int) -> str:
    array = json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=style == 1)
    return ("<|tool_call|>", "<tool_call>", " ")[style] + array


def _hunyuan(calls: list[Call], style: int) -> str:
    array = json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=style == 1)
    return "<tool_calls>" + " " * style + array + "</tool_calls>" + "\n" * style


def _kimi_k2(calls: list[Call], style: int) -> str:
    prefix = "functions." if style != 1 else ""
    return (
        "<|tool_calls_section_begin|>"
        + "\n" * style
        + "".join(
            f"<|tool_call_begin|>{prefix}{n}:{i}<|tool_call_argument_begin|>"
            f"{json.dumps(a, indent=style or None, ensure_ascii=style == 1)}<|tool_call_end|>"
            for i, (n, a) in enumerate(calls)
        )
        + "<|tool_calls_section_end|>"
    )


def _glm45(calls: list[Call], style: int) -> str:
    def raw(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    gap = "" if style == 1 else "\n"  # GLM-4.7 writes no newlines
    return "\n".join(
        f"<tool_call>{n}{gap}"
        + "".join(
            f"<arg_key>{k}</arg_key>{gap}<arg_value>{raw(v)}</arg_value>{gap}" for k, v in a.items()
        )
        + "</tool_call>"
        for n, a in calls
    )


def _minimax_m2(calls: list[Call], style: int) -> str:
    def raw(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    quote = ('"', "", "'")[style]
    invokes = "\n".join(
        f"<invoke name={quote}{n}{quote}>\n"
        + "".join(f"<parameter name={quote}{k}{quote}>{raw(v)}</parameter>\n" for k, v in a.items())
        + "</invoke>"
        for n, a in calls
    )
    return f"<minimax:tool_call>\n{invokes}\n</minimax:tool_call>"


def _openai(calls: list[Call], style: int) -> str:
    """As gateway/harmony.py keeps GPT-OSS's calls in the content."""
    return "".join(
        f"<|start|>assistant to=functions.{n}<|channel|>commentary json<|message|>"
        f"{json.dumps(a, indent=style or None, ensure_ascii=style == 1)}<|call|>"
        for n, a in calls
    )


RENDER = {
    "hermes": _hermes,
    "llama3_json": _llama3,
    "mistral": _mistral,
    "pythonic": _pythonic,
    "qwen3_coder": _qwen3_coder,
    "deepseek_v3": _deepseek_v3,
    "deepseek_v31": _deepseek_v31,
    "granite": _granite,
    "kimi_k2": _kimi_k2,
    "glm45": _glm45,
    "minimax_m2": _minimax_m2,
    "seed_oss": _seed_oss,
    "hunyuan_a13b": _hunyuan,
    "openai": _openai,
}

_LEAD_ONLY = ("pythonic", "llama3_json", "granite")  # calls only where the reply opens with them
_CHARS = st.sampled_from(list("ab Z\"\\'{}[](),:;<>=/#`\n\té€😀"))
_TEXT = st.text(_CHARS, max_size=6)
_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    _TEXT,
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=5,
)
_ARGS = st.dictionaries(
    st.sampled_from(["city", "days", "hot", "opts", "tags", "x_1"]), _VALUE, max_size=3
)
_CALLS = st.lists(
    st.tuples(st.sampled_from(["get_weather", "get_time"]), _ARGS), min_size=1, max_size=3
)
_CONTENT = st.text(st.sampled_from(list("Ok, let me check é.\n ")), max_size=12)


@st.composite
def replies(draw: st.DrawFn, parser: str) -> tuple[str, list[str], bool]:
    """(a reply, the deltas it comes in, whether it stopped by itself): calls in `parser`'s
    format after some content, sometimes broken (cut short, a tool that does not exist)."""
    calls = draw(_CALLS)
    if draw(st.integers(0, 5)) == 0:
        calls[-1] = ("get_news", calls[-1][1])
    lead = "" if parser in _LEAD_ONLY else draw(_CONTENT)
    text = lead + RENDER[parser](calls, draw(st.integers(0, 2)))
    if parser == "hermes":  # text between and after blocks is content too
        text = text.replace("</tool_call>\n", "</tool_call>" + draw(_CONTENT)) + draw(_CONTENT)
    if draw(st.integers(0, 3)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    stopped = draw(st.integers(0, 4)) > 0
    cuts = sorted({c % (len(text) + 1) for c in draw(st.lists(st.integers(0, 10**4), max_size=16))})
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)], stopped


def _stream(parser: str, deltas: list[str], stopped: bool) -> tuple[list[StreamPiece], StreamEnd]:
    calls = streamed_calls(TOOLS, parser)  # type: ignore[arg-type]
    pieces = [p for d in deltas for p in calls.delta(d)]
    return pieces, calls.finish(stopped)


def _read(pieces: list[StreamPiece]) -> tuple[str, list[CallOpened], list[str]]:
    """(content, the calls opened, each one's arguments put together), checking each call
    opens once, in order, before its arguments."""
    content, opened, arguments = "", [], []
    for piece in pieces:
        match piece:
            case ContentPiece(text=text):
                content += text
            case CallOpened(index=index):
                assert index == len(opened), pieces
                opened.append(piece)
                arguments.append("")
            case ArgumentsPiece(index=index, text=text):
                assert index < len(opened) and text, pieces
                arguments[index] += text
    return content, opened, arguments


def _loads(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return ("not JSON", arguments)


@pytest.mark.parametrize("parser", TOOL_PARSERS)
@settings(max_examples=50, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_streamed_calls_end_as_the_whole_parse(parser: str, data: st.DataObject) -> None:
    text, deltas, stopped = data.draw(replies(parser))
    pieces, end = _stream(parser, deltas, stopped)
    content, opened, arguments = _read(pieces + list(end.pieces))
    whole_content, whole = (text, [])  # cut by max_tokens: text, as unstreamed
    if stopped:
        whole_content, whole = parse_auto_calls(text, TOOLS, parser)  # type: ignore[arg-type]
    assert len({o.call_id for o in opened}) == len(opened)
    assert all(o.name in ("get_weather", "get_time") for o in opened)  # only the request's tools
    if whole:
        assert end.is_calls and end.text == ""
        assert [o.name for o in opened] == [c["function"]["name"] for c in whole]
        assert [_loads(a) for a in arguments] == [_loads(c["function"]["arguments"]) for c in whole]
        if parser == "hermes":  # the whole parse strips what is between and around blocks
            assert (content.strip() or None) == ((whole_content or "").strip() or None)
        else:
            assert (content or None) == whole_content
    elif not opened:  # nothing went out as a call: the text is the content, as unstreamed
        assert not end.is_calls and content + end.text == text
    else:  # a call went out: the stream ends there, the held text not sent as content
        assert not end.is_calls and end.text == ""
        assert parser == "hermes" or text.startswith(content)


TWO_CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})]


@pytest.mark.parametrize("parser", TOOL_PARSERS)
def test_each_call_goes_out_as_it_is_written(parser: str) -> None:
    """Fed a character at a time: a call's name goes out before its arguments are written,
    and its arguments (in more than one piece) before the next call begins."""
    text = "Sure. " * (parser not in _LEAD_ONLY) + RENDER[parser](TWO_CALLS, 0)
    calls = streamed_calls(TOOLS, parser)  # type: ignore[arg-type]
    seen = [(i, piece) for i in range(len(text)) for piece in calls.delta(text[i])]
    assert calls.finish(True).is_calls
    opened = [(i, p.name) for i, p in seen if isinstance(p, CallOpened)]
    assert [name for _, name in opened] == ["get_weather", "get_time"]
    assert opened[0][0] < text.index("Paris") and opened[1][0] < text.index("CET")
    first = [p.text for i, p in seen if isinstance(p, ArgumentsPiece) and p.index == 0]
    assert len(first) >= 2 and json.loads("".join(first)) == TWO_CALLS[0][1]
    last_of_first = max(i for i, p in seen if isinstance(p, ArgumentsPiece) and p.index == 0)
    assert last_of_first < text.index("get_time")


@pytest.mark.parametrize(
    ("parser", "want"),
    [  # pythonic: the last argument's `)` closes the call too
        ("pythonic", ['{"city": "Paris"', ', "days": 3}']),
        ("qwen3_coder", ['{"city": "Paris"', ', "days": 3', "}"]),
        ("seed_oss", ['{"city": "Paris"', ', "days": 3', "}"]),
        ("glm45", ['{"city": "Paris"', ', "days": 3', "}"]),
        ("minimax_m2", ['{"city": "Paris"', ', "days": 3', "}"]),
    ],
)
def test_arguments_not_json_in_the_text_go_out_one_argument_at_a_time(
    parser: str, want: list[str]
) -> None:
    text = RENDER[parser](TWO_CALLS[:1], 0)
    calls = streamed_calls(TOOLS, parser)  # type: ignore[arg-type]
    pieces = [p.text for ch in text for p in calls.delta(ch) if isinstance(p, ArgumentsPiece)]
    assert pieces == want and calls.finish(True).pieces == ()


def test_json_arguments_go_out_as_written_less_what_is_not_final() -> None:
    """An escape is not cut, nor does a piece end in whitespace outside a string."""
    arguments = '{\n  "city": "Pa\\u00e9ris\\n",\n  "days": 3\n}'
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'
    calls = streamed_calls(TOOLS, "hermes")
    pieces = [p.text for ch in text for p in calls.delta(ch) if isinstance(p, ArgumentsPiece)]
    assert "".join(pieces) == arguments and calls.finish(True).pieces == ()
    escape = arguments.index("\\u")
    ends = [len("".join(pieces[: n + 1])) for n in range(len(pieces))]
    assert not [e for e in ends if escape < e < escape + 6]
    assert not [e for e in ends if arguments[e - 1].isspace()]


@pytest.mark.parametrize(
    ("text", "stopped"),
    [
        ('Hi <tool_call>\n{"name": "get_news", "arguments": {"a": 1}}\n</tool_call>', True),
        ('<tool_call>\n{"name": "get_weather"', False),  # cut before its arguments began
        ("<tool_call>\n[1, 2]\n</tool_call>", True),
    ],
)
def test_a_reply_no_call_went_out_of_ends_as_its_text(text: str, stopped: bool) -> None:
    pieces, end = _stream("hermes", list(text), stopped)
    assert (
        not end.is_calls
        and "".join(p.text for p in pieces if isinstance(p, ContentPiece)) + end.text == text
    )
    assert not [p for p in pieces if not isinstance(p, ContentPiece)]


def test_a_call_cut_short_after_it_went_out_ends_there() -> None:
    """max_tokens cut the arguments: what went out stays, nothing is sent again as text."""
    text = 'Let me see.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    pieces, end = _stream("hermes", [text[:30], text[30:]], stopped=False)
    content, opened, arguments = _read(pieces)
    assert (content, [o.name for o in opened], arguments) == (
        "Let me see.",
        ["get_weather"],
        ['{"city": "Par'],
    )
    assert end == StreamEnd(False)


def test_seed_oss_blocks_close_their_calls() -> None:
    """Seed-OSS's wrapper is read as Qwen3-Coder's is: a call whose block closed is whole
    though the model left its `</function>` out and the answer goes on."""
    from troupe.gateway.tool_auto import auto_call_reader

    text = "<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</seed:tool_call>\n"
    (call,) = auto_call_reader(TOOLS, "seed_oss").read(text, 0, is_final=False).calls
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
