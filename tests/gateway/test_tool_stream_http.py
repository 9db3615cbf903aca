"""tool_choice "auto" streamed over HTTP, read with the official `openai` client (its chunk
models are the schema check, and its `chat.completions.stream` helper accumulates the calls as
agents do): a scripted model says Hermes and pythonic calls a token at a time, and each call
comes out as it is written (id, type and name once, then its arguments in pieces), ending with
finish_reason "tool_calls"; a call cut by max_tokens ends with "length" and is not sent again
as content."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionChunk
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model
from tests.gateway.test_tool_auto_http import HERMES_TEMPLATE

PLAIN_TEMPLATE = """\
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
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "Weather in Paris and Lyon?"}]
CALLS = [
    ("get_weather", {"city": "Paris", "days": 3}),
    ("get_weather", {"city": "Lyon", "days": 1}),
]
HERMES = "Let me check.\n" + "\n".join(
    f'<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>' for n, a in CALLS
)
PYTHONIC = "[" + ", ".join(f'{n}(city="{a["city"]}", days={a["days"]})' for n, a in CALLS) + "]"
# parser -> (the template, the reply, the content streamed before the calls, the ids)
CASES = {
    "hermes": (HERMES_TEMPLATE, HERMES, "Let me check.\n", r"call_[0-9a-f]{24}"),
    "pythonic": (PLAIN_TEMPLATE, PYTHONIC, "", r"chatcmpl-tool-[0-9a-f]{32}"),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    folder: Path = template_model(tmp_path_factory.mktemp("model"), CASES[request.param][0])
    parser = None if request.param == "hermes" else request.param  # Hermes: from the template
    settings = GatewaySettings(tool_call_parser=parser)  # type: ignore[arg-type]
    srv = scripted_server(folder, settings).start()
    srv.case = request.param  # type: ignore[attr-defined]
    yield srv
    srv.shutdown()


def _body(server: ServerThread, **extra: Any) -> dict[str, Any]:
    return {
        "model": server.engine.model_name,
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": 128,
        **extra,
    }


def _chunks(server: ServerThread, **extra: Any) -> list[ChatCompletionChunk]:
    client = openai_client(server.url)
    return list(client.chat.completions.create(stream=True, **_body(server, **extra)))


def test_each_call_streams_as_it_is_written(server: ServerThread) -> None:
    _, reply, content, id_pattern = CASES[server.case]  # type: ignore[attr-defined]
    say(server, reply)
    chunks = _chunks(server)
    assert all(c.object == "chat.completion.chunk" and len(c.choices) == 1 for c in chunks)
    said = "".join(c.choices[0].delta.content or "" for c in chunks)
    finishes = [
        (n, c.choices[0].finish_reason) for n, c in enumerate(chunks) if c.choices[0].finish_reason
    ]
    assert said == content and finishes == [(len(chunks) - 1, "tool_calls")]
    deltas = [(n, d) for n, c in enumerate(chunks) for d in c.choices[0].delta.tool_calls or ()]
    opened: dict[int, int] = {}  # a call's index -> the chunk that opened it
    arguments: dict[int, list[str]] = {}
    for n, delta in deltas:
        assert delta.function is not None
        if delta.index not in opened:  # the first delta of a call: id, type, name
            assert re.fullmatch(id_pattern, delta.id or ""), delta
            assert delta.type == "function" and delta.function.name == "get_weather"
            assert delta.function.arguments == "" and delta.index == len(opened)
            opened[delta.index], arguments[delta.index] = n, []
        else:  # then only arguments
            assert delta.id is None and delta.type is None and delta.function.name is None
            assert delta.function.arguments
            arguments[delta.index].append(delta.function.arguments)
    assert [json.loads("".join(arguments[i])) for i in sorted(arguments)] == [a for _, a in CALLS]
    assert all(len(pieces) >= 2 for pieces in arguments.values())  # in pieces, not whole
    last_of_first = max(n for n, d in deltas if d.index == 0)
    assert opened[0] < last_of_first < opened[1]  # the first went out before the second began

    whole = openai_client(server.url).chat.completions.create(**_body(server)).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls is not None
    functions = [c.function for c in whole.message.tool_calls]  # type: ignore[union-attr]
    assert [(f.name, json.loads(f.arguments)) for f in functions] == CALLS


def test_the_clients_stream_helper_reads_the_calls(server: ServerThread) -> None:
    say(server, CASES[server.case][1])  # type: ignore[attr-defined]
    client = openai_client(server.url)
    pieces: dict[int, int] = {}
    with client.chat.completions.stream(**_body(server)) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                pieces[event.index] = pieces.get(event.index, 0) + 1
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
    got = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert got == CALLS and min(pieces.values()) >= 2 and sorted(pieces) == [0, 1]


def test_a_call_cut_by_max_tokens_ends_with_length(server: ServerThread) -> None:
    """The call went out as far as it was written; the stream ends "length" without sending
    its text again as content (unstreamed, the same reply is its text, as before)."""
    _, reply, content, _ = CASES[server.case]  # type: ignore[attr-defined]
    say(server, reply)
    tokenizer = server.engine.tokenizer
    ids = tokenizer.encode(reply, False)
    cut = next(k for k in range(len(ids)) if "Par" in tokenizer.decode(ids[:k]))
    chunks = _chunks(server, max_tokens=cut)
    said = "".join(c.choices[0].delta.content or "" for c in chunks)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    names = [
        d.function.name
        for c in chunks
        for d in c.choices[0].delta.tool_calls or ()
        if d.function and d.function.name
    ]
    assert (said, finishes, names) == (content, ["length"], ["get_weather"])
    whole = openai_client(server.url).chat.completions.create(**_body(server, max_tokens=cut))
    assert whole.choices[0].finish_reason == "length" and not whole.choices[0].message.tool_calls
    assert whole.choices[0].message.content == tokenizer.decode(ids[:cut])
