"""tool_choice "auto" streamed over HTTP, read with the official `openai` client (its chunk
models are the schema check, and its `chat.completions.stream` helper accumulates the calls as
agents do): a scripted model says Hermes and pythonic calls a token at a time, and each call
comes out as it is written (id, type and name once, then its arguments in pieces), ending with
finish_reason "tool_calls"; a call cut by max_tokens ends with "length" and is not sent again
as content.

/v1/responses with `stream: true` (below) sends each call the same way, as OpenAI's events:
response.output_item.added (a function_call, arguments ""), its
response.function_call_arguments.delta pieces, .done with the whole arguments, then
response.output_item.done; the Hermes reply's JSON is spaced its own way and holds an escape,
and the pieces put together are the item's arguments, byte for byte the whole (unstreamed)
answer's; the stored and background objects are the whole answer's too; a call cut by
max_output_tokens, or one that then does not parse, ends "incomplete"; `responses.stream`
reads the calls."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model
from tests.gateway.test_tool_auto_http import HERMES_TEMPLATE
from tests.gateway.tool_specs import WEATHER

PLAIN_TEMPLATE = """\
{%- for m in messages %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
TOOLS = [WEATHER]
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
    settings = GatewaySettings(tool_call_parser=parser, max_stored_responses=8)  # type: ignore[arg-type]
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


# -- /v1/responses -------------------------------------------------------------------------

RESPONSES_TOOLS: Any = [{"type": "function", **tool["function"]} for tool in TOOLS]
# as a model may space it; json.dumps (the whole parse) writes {"city": "Paris", "days": 3}
HERMES_SPACED = (
    "Let me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","days":3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Ly\\u006fn", "days": 1}}\n'
    "</tool_call>"
)
# parser -> (the reply, the message's text)
RESPONSES_CASES = {"hermes": (HERMES_SPACED, "Let me check."), "pythonic": (PYTHONIC, None)}
CALL_EVENTS = ("response.function_call_arguments.delta", "response.function_call_arguments.done")


def _responses_args(**extra: Any) -> dict[str, Any]:
    return {
        "model": "",
        "input": MESSAGES[0]["content"],
        "tools": RESPONSES_TOOLS,
        "max_output_tokens": 128,
        **extra,
    }


def _responses_events(client: OpenAI, **extra: Any) -> list[Any]:
    return list(client.responses.create(stream=True, **_responses_args(**extra)))


def _calls_of(events: list[Any]) -> dict[int, dict[str, Any]]:
    """Each function_call item's events, by output_index: its added item, deltas, done
    arguments, done item."""
    calls: dict[int, dict[str, Any]] = {}
    for n, e in enumerate(events):
        if e.type == "response.output_item.added" and e.item.type == "function_call":
            calls[e.output_index] = {"added": e.item, "at": n, "deltas": [], "last_delta": n}
        elif e.type == "response.function_call_arguments.delta":
            calls[e.output_index]["deltas"].append(e.delta)
            calls[e.output_index]["last_delta"] = n
        elif e.type == "response.function_call_arguments.done":
            calls[e.output_index]["arguments"] = e.arguments
        elif e.type == "response.output_item.done" and e.item.type == "function_call":
            calls[e.output_index]["item"] = e.item
    return calls


def _shape(output: list[Any]) -> list[tuple[Any, ...]]:
    """Output items less their random ids."""
    return [
        (i.type, i.status, i.name, i.arguments)
        if i.type == "function_call"
        else (i.type, i.status, [c.text for c in i.content])
        for i in output
    ]


def test_responses_stream_each_call_as_it_is_written(server: ServerThread) -> None:
    reply, text = RESPONSES_CASES[server.case]  # type: ignore[attr-defined]
    id_pattern = CASES[server.case][3]  # type: ignore[attr-defined]
    say(server, reply)
    client = openai_client(server.url)
    events = _responses_events(client)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    final = events[-1].response
    assert final.status == "completed"
    whole = client.responses.create(**_responses_args())
    assert _shape(final.output) == _shape(whole.output)  # the streamed answer is the whole one
    assert final.output_text == whole.output_text == (text or "")

    calls = _calls_of(events)
    indices = sorted(calls)
    assert indices == [i for i, item in enumerate(final.output) if item.type == "function_call"]
    for index, expected in zip(indices, CALLS, strict=True):
        call = calls[index]
        added, item = call["added"], call["item"]
        assert (added.name, added.arguments, added.status) == ("get_weather", "", "in_progress")
        assert re.fullmatch(id_pattern, added.call_id) and added.id == item.id
        assert len(call["deltas"]) >= 2  # in pieces as written, not whole
        assert "".join(call["deltas"]) == call["arguments"] == item.arguments
        assert item.arguments == final.output[index].arguments == whole.output[index].arguments
        assert json.loads(item.arguments) == expected[1] and item.status == "completed"
        assert item.call_id == added.call_id == final.output[index].call_id
    first, second = (calls[i] for i in indices)
    assert first["at"] < first["last_delta"] < second["at"]  # the first went out before the second


def test_the_clients_responses_stream_helper_reads_the_calls(server: ServerThread) -> None:
    say(server, RESPONSES_CASES[server.case][0])  # type: ignore[attr-defined]
    snapshots: dict[int, str] = {}  # the helper's arguments so far, by output index
    with openai_client(server.url).responses.stream(**_responses_args()) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                snapshots[event.output_index] = event.snapshot
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS
    assert [snapshots[i] for i in sorted(snapshots)] == [c.arguments for c in calls]


def test_a_responses_call_cut_by_max_output_tokens_ends_incomplete(server: ServerThread) -> None:
    """The call went out as far as it was written: its item ends "incomplete" with those
    arguments, and the response "incomplete" (max_output_tokens), as chat's stream ends
    "length"; its text is not sent again as a message. Unstreamed, the reply is its text."""
    reply, text = RESPONSES_CASES[server.case]  # type: ignore[attr-defined]
    say(server, reply)
    tokenizer = server.engine.tokenizer
    ids = tokenizer.encode(reply, False)
    cut = next(k for k in range(len(ids)) if "Par" in tokenizer.decode(ids[:k]))
    client = openai_client(server.url)
    events = _responses_events(client, max_output_tokens=cut)
    final = events[-1].response
    assert events[-1].type == "response.completed" and final.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    (call,) = _calls_of(events).values()
    assert call["item"].status == "incomplete"
    assert "".join(call["deltas"]) == call["arguments"] == call["item"].arguments
    assert '{"city": "Paris", "days": 3}'.startswith(call["arguments"])
    if server.case == "hermes":  # type: ignore[attr-defined]  # pythonic: members once whole
        assert call["arguments"].startswith('{"city": "Par')
    assert final.output_text == (text or "")
    whole = client.responses.create(**_responses_args(max_output_tokens=cut))
    assert [i.type for i in whole.output] == ["message"] and whole.status == "incomplete"
    assert whole.output_text == tokenizer.decode(ids[:cut])


def test_a_responses_call_that_then_does_not_parse_ends_incomplete(server: ServerThread) -> None:
    """The reply stops by itself but its calls do not parse: the call that went out ends
    "incomplete", the response "completed" (chat's stream: "stop", no "tool_calls")."""
    written = RESPONSES_CASES[server.case][0]  # type: ignore[attr-defined]
    reply = written.replace("}}\n</tool_call>\n", "}\n</tool_call>\n")  # a brace short
    reply = reply.replace("days=3)", "days=3) + 1")  # not a call
    assert reply != written
    say(server, reply)
    events = _responses_events(openai_client(server.url))
    final = events[-1].response
    assert final.status == "completed" and final.incomplete_details is None
    statuses = [c["item"].status for c in _calls_of(events).values()]
    assert statuses and set(statuses) == {"incomplete"}
    assert "get_weather" not in final.output_text


def test_stored_and_background_responses_are_the_whole_answer(server: ServerThread) -> None:
    say(server, RESPONSES_CASES[server.case][0])  # type: ignore[attr-defined]
    client = openai_client(server.url)
    streamed = _responses_events(client)[-1].response
    assert client.responses.retrieve(streamed.id) == streamed  # stored as it completed
    created = client.responses.create(background=True, **_responses_args())
    events = list(client.responses.retrieve(created.id, stream=True))
    assert [e.type for e in events if e.type in CALL_EVENTS].count(CALL_EVENTS[1]) == 2
    done = client.responses.retrieve(created.id)
    assert done == events[-1].response and done.status == "completed"
    assert _shape(done.output) == _shape(client.responses.create(**_responses_args()).output)
