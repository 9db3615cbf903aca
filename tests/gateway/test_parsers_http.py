"""The tool-call parsers mistral, pythonic, qwen3_coder, seed_oss, deepseek_v3, deepseek_v31,
granite, kimi_k2, glm45, minimax_m2 and hunyuan_a13b and the reasoning parsers deepseek_v3, mistral,
granite, glm45, minimax_m2, seed_oss, hunyuan_a13b and ernie45 over HTTP with the official `openai` client: a server started with the
flag, a fake runner made to say an exact reply (SmolLM2's tokenizer, a plain template), the
whole answer and the streamed one read back. Streamed calls arrive as OpenAI sends them: a
delta with the id, type and name, then the arguments as written; a call that went out before
the reply broke is not sent again as text (gateway/tool_stream.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model
from tests.gateway.tool_specs import WEATHER

TEMPLATE = """\
{%- for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if thinking is defined %}{% if thinking %}<think>{% else %}</think>{% endif %}{% endif %}
{%- endif %}"""

TOOLS = [WEATHER]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = ("get_weather", {"city": "Paris", "days": 3})
VLLM_ID = r"chatcmpl-tool-[0-9a-f]{32}"

# parser -> (the model's reply, the content, the call, the id's pattern)
TOOL_CASES: dict[str, tuple[str, str | None, tuple[str, Any], str]] = {
    "mistral": (
        'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}',
        "Sure. ",
        WEATHER,
        r"[A-Za-z0-9]{9}",
    ),
    "pythonic": ('[get_weather(city="Paris", days=3)]', None, WEATHER, VLLM_ID),
    "qwen3_coder": (
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "Checking.\n",
        WEATHER,
        r"call_[0-9a-f]{24}",
    ),
    "seed_oss": (
        "<seed:think>Weather.</seed:think>Checking.\n<seed:tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>"
        "\n</seed:tool_call>",
        "<seed:think>Weather.</seed:think>Checking.\n",
        WEATHER,
        r"call_[0-9a-f]{24}",
    ),
    "deepseek_v3": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        None,
        WEATHER,
        VLLM_ID,
    ),
    "deepseek_v31": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris", "days": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        None,
        WEATHER,
        VLLM_ID,
    ),
    "granite": (
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]',
        None,
        WEATHER,
        VLLM_ID,
    ),
    "kimi_k2": (
        "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
        "Checking.",
        WEATHER,
        r"functions\.get_weather:0",
    ),
    "glm45": (
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        None,
        WEATHER,
        VLLM_ID,
    ),
    "hunyuan_a13b": (
        'Checking.<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]'
        "</tool_calls>",
        "Checking.",
        WEATHER,
        VLLM_ID,
    ),
    "minimax_m2": (
        'Checking.<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">'
        'Paris</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n'
        "</minimax:tool_call>",
        "Checking.",
        WEATHER,
        r"call_[0-9a-f]{24}",
    ),
}
UNQUOTED = (
    "qwen3_coder",
    "glm45",
    "minimax_m2",
    "seed_oss",
)  # formats whose string values are not quoted


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return template_model(tmp_path_factory.mktemp("parsers-model"), TEMPLATE)


@pytest.fixture(scope="module", params=sorted(TOOL_CASES))
def tool_server(request: pytest.FixtureRequest, model: Path) -> Iterator[ServerThread]:
    srv = scripted_server(model, GatewaySettings(tool_call_parser=request.param)).start()
    yield srv
    srv.shutdown()


def test_tool_calls_whole_and_streamed(tool_server: ServerThread) -> None:
    parser = tool_server.settings.tool_call_parser
    assert parser is not None
    text, content, call, id_pattern = TOOL_CASES[parser]
    say(tool_server, text)
    client = openai_client(tool_server.url)
    body: dict[str, Any] = {
        "model": tool_server.engine.model_name,
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": 96,
    }
    choice = client.chat.completions.create(**body).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == content
    (found,) = choice.message.tool_calls or ()
    assert re.fullmatch(id_pattern, found.id), found.id
    assert (found.function.name, json.loads(found.function.arguments)) == call  # type: ignore[union-attr]

    said, deltas, finishes = "", [], []
    for chunk in client.chat.completions.create(stream=True, **body):
        for c in chunk.choices:
            said += c.delta.content or ""
            deltas += [d.model_dump(exclude_none=True) for d in c.delta.tool_calls or ()]
            if c.finish_reason:
                finishes.append(c.finish_reason)
    assert (said or None, finishes) == (content, ["tool_calls"])
    head, *rest = deltas
    assert re.fullmatch(id_pattern, head["id"]) and head["type"] == "function"
    assert head["function"] == {"name": call[0], "arguments": ""}  # the name first
    assert all(d["index"] == 0 and "id" not in d and "name" not in d["function"] for d in rest)
    arguments = "".join(d["function"]["arguments"] for d in rest)
    assert arguments == found.function.arguments  # type: ignore[union-attr]


def test_a_reply_that_does_not_parse_is_text(tool_server: ServerThread) -> None:
    parser = tool_server.settings.tool_call_parser
    assert parser is not None
    text = TOOL_CASES[parser][0].replace("Paris", 'Pa"ris')  # breaks each format's value
    if parser in UNQUOTED:  # a quote does not break them: name an unknown tool instead
        text = text.replace("get_weather", "get_wether")
    say(tool_server, text)
    client = openai_client(tool_server.url)
    body: dict[str, Any] = {
        "model": tool_server.engine.model_name,
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": 96,
    }
    choice = client.chat.completions.create(**body).choices[0]
    assert (choice.finish_reason, choice.message.content) == ("stop", text)
    assert not choice.message.tool_calls
    said, names, finishes = "", [], []
    for chunk in client.chat.completions.create(stream=True, **body):
        for c in chunk.choices:
            names += [d.function.name for d in c.delta.tool_calls or () if d.function]
            said += c.delta.content or ""
            finishes += [c.finish_reason] if c.finish_reason else []
    assert finishes == ["stop"]
    if parser in UNQUOTED:  # an unknown tool: no call opens, the reply is its text
        assert (said, names) == (text, [])
    else:  # the call went out as written before its value broke: never sent again as text
        assert (said, [n for n in names if n]) == (TOOL_CASES[parser][1] or "", ["get_weather"])


# parser -> (chat_template_kwargs, the model's reply, the reasoning, the content)
REASONING_CASES: dict[str, tuple[dict[str, Any], str, str | None, str | None]] = {
    "mistral": (
        {},
        "[THINK]Paris is in France.[/THINK]It is sunny.",
        "Paris is in France.",
        "It is sunny.",
    ),
    "granite": (
        {},
        "Here is my thought process:\nLook it up.\nHere is my response:\nSunny.",
        "\nLook it up.\n",
        "\nSunny.",
    ),
    "deepseek_v3": ({"thinking": True}, "Look it up.</think>Sunny.", "Look it up.", "Sunny."),
    "glm45": ({}, "<think>Look it up.</think>Sunny.", "Look it up.", "Sunny."),
    "minimax_m2": ({}, "Look it up.</think>Sunny.", "Look it up.", "Sunny."),
    "seed_oss": (
        {},
        "<seed:think>Look it up.<seed:cot_budget_reflect>8 left</seed:cot_budget_reflect>"
        "</seed:think>Sunny.",
        "Look it up.<seed:cot_budget_reflect>8 left</seed:cot_budget_reflect>",
        "Sunny.",
    ),
    "hunyuan_a13b": (
        {},
        "<think>\nLook it up.\n</think>\n<answer>\nSunny.\n</answer>",
        "Look it up.",
        "Sunny.",
    ),
    "ernie45": ({}, "Look it up.\n</think>\n\n<response>\nSunny.\n</response>\n", "Look it up.\n", "Sunny."),
}


@pytest.fixture(scope="module", params=sorted(REASONING_CASES))
def reasoning_server(request: pytest.FixtureRequest, model: Path) -> Iterator[ServerThread]:
    srv = scripted_server(model, GatewaySettings(reasoning_parser=request.param)).start()
    yield srv
    srv.shutdown()


def test_reasoning_whole_and_streamed(reasoning_server: ServerThread) -> None:
    parser = reasoning_server.settings.reasoning_parser
    assert parser is not None
    kwargs, text, reasoning, content = REASONING_CASES[parser]
    say(reasoning_server, text)
    client = openai_client(reasoning_server.url)
    body: dict[str, Any] = {
        "model": reasoning_server.engine.model_name,
        "messages": MESSAGES,
        "max_tokens": 96,
        "extra_body": {"chat_template_kwargs": kwargs},
    }
    message = client.chat.completions.create(**body).choices[0].message
    assert ((message.model_extra or {}).get("reasoning_content"), message.content) == (
        reasoning,
        content,
    )
    thought, said = "", ""
    for chunk in client.chat.completions.create(stream=True, **body):
        for c in chunk.choices:
            thought += (c.delta.model_extra or {}).get("reasoning_content") or ""
            said += c.delta.content or ""
    assert (thought or None, said or None) == (reasoning, content)


@pytest.mark.parametrize("parser", ["deepseek_v3", "glm45"])
def test_a_hybrid_without_thinking_is_all_content(model: Path, parser: str) -> None:
    srv = scripted_server(model, GatewaySettings(reasoning_parser=parser)).start()  # type: ignore[arg-type]
    try:
        say(srv, "x</think>Sunny.")
        message = (
            openai_client(srv.url)
            .chat.completions.create(
                model=srv.engine.model_name,
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=96,
                extra_body={"chat_template_kwargs": {"thinking": False}},
            )
            .choices[0]
            .message
        )
        assert (message.model_extra or {}).get("reasoning_content") is None
        assert message.content == "x</think>Sunny."
    finally:
        srv.shutdown()


def test_hunyuan_thinks_then_calls_in_its_answer(model: Path) -> None:
    """Hunyuan-A13B's two parsers together: the thinking out, the <answer> tags away, the call
    in them read; whole and streamed."""
    settings = GatewaySettings(reasoning_parser="hunyuan_a13b", tool_call_parser="hunyuan_a13b")
    srv = scripted_server(model, settings).start()
    try:
        say(srv, "<think>\nLook it up.\n</think>\n<answer>\n" + TOOL_CASES["hunyuan_a13b"][0]
            + "\n</answer>")  # fmt: skip
        client = openai_client(srv.url)
        body: dict[str, Any] = {
            "model": srv.engine.model_name,
            "messages": MESSAGES,
            "tools": TOOLS,
            "max_tokens": 96,
        }
        choice = client.chat.completions.create(**body).choices[0]
        message = choice.message
        assert (choice.finish_reason, message.content) == ("tool_calls", "Checking.")
        assert (message.model_extra or {}).get("reasoning_content") == "Look it up."
        (found,) = message.tool_calls or ()
        assert (found.function.name, json.loads(found.function.arguments)) == WEATHER  # type: ignore[union-attr]
        thought, said, names = "", "", []
        for chunk in client.chat.completions.create(stream=True, **body):
            for c in chunk.choices:
                thought += (c.delta.model_extra or {}).get("reasoning_content") or ""
                said += c.delta.content or ""
                names += [d.function.name for d in c.delta.tool_calls or () if d.function]
        assert (thought, said, [n for n in names if n]) == ("Look it up.", "Checking.", ["get_weather"])
    finally:
        srv.shutdown()
