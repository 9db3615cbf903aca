"""/v1/responses with `stream: true` and tool_choice "auto" sends each function call as the
model writes it (OpenAI's events, read with the official `openai` client, whose event models are
the schema check): response.output_item.added (a function_call, arguments ""), its
response.function_call_arguments.delta pieces, .done with the whole arguments, then
response.output_item.done. A scripted model says Hermes calls (JSON spaced its own way, with an
escape) and pythonic calls a token at a time; the pieces put together are the item's arguments,
byte for byte the whole (unstreamed) answer's, and the stored and background objects are the
whole answer's too. A call cut by max_output_tokens, or one that then does not parse, ends
"incomplete"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model
from tests.gateway.test_tool_auto_http import HERMES_TEMPLATE
from tests.gateway.test_tool_stream_http import CALLS, PLAIN_TEMPLATE, PYTHONIC
from tests.gateway.test_tool_stream_http import TOOLS as CHAT_TOOLS

TOOLS: Any = [{"type": "function", **tool["function"]} for tool in CHAT_TOOLS]
QUESTION = "Weather in Paris and Lyon?"
# as a model may space it; json.dumps (the whole parse) writes {"city": "Paris", "days": 3}
HERMES = (
    "Let me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","days":3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Ly\\u006fn", "days": 1}}\n'
    "</tool_call>"
)
# parser -> (the template, the reply, the message's text, the call ids)
CASES = {
    "hermes": (HERMES_TEMPLATE, HERMES, "Let me check.", r"call_[0-9a-f]{24}"),
    "pythonic": (PLAIN_TEMPLATE, PYTHONIC, None, r"chatcmpl-tool-[0-9a-f]{32}"),
}
CALL_EVENTS = ("response.function_call_arguments.delta", "response.function_call_arguments.done")


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


def _args(**extra: Any) -> dict[str, Any]:
    return {"model": "", "input": QUESTION, "tools": TOOLS, "max_output_tokens": 128, **extra}


def _events(client: OpenAI, **extra: Any) -> list[Any]:
    return list(client.responses.create(stream=True, **_args(**extra)))


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


def test_each_call_streams_as_it_is_written(server: ServerThread) -> None:
    _, reply, text, id_pattern = CASES[server.case]  # type: ignore[attr-defined]
    say(server, reply)
    client = openai_client(server.url)
    events = _events(client)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    final = events[-1].response
    assert final.status == "completed"
    whole = client.responses.create(**_args())
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


def test_the_clients_stream_helper_reads_the_calls(server: ServerThread) -> None:
    say(server, CASES[server.case][1])  # type: ignore[attr-defined]
    snapshots: dict[int, str] = {}  # the helper's arguments so far, by output index
    with openai_client(server.url).responses.stream(**_args()) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                snapshots[event.output_index] = event.snapshot
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS
    assert [snapshots[i] for i in sorted(snapshots)] == [c.arguments for c in calls]


def test_a_call_cut_by_max_output_tokens_ends_incomplete(server: ServerThread) -> None:
    """The call went out as far as it was written: its item ends "incomplete" with those
    arguments, and the response "incomplete" (max_output_tokens), as chat's stream ends
    "length"; its text is not sent again as a message. Unstreamed, the reply is its text."""
    _, reply, text, _ = CASES[server.case]  # type: ignore[attr-defined]
    say(server, reply)
    tokenizer = server.engine.tokenizer
    ids = tokenizer.encode(reply, False)
    cut = next(k for k in range(len(ids)) if "Par" in tokenizer.decode(ids[:k]))
    client = openai_client(server.url)
    events = _events(client, max_output_tokens=cut)
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
    whole = client.responses.create(**_args(max_output_tokens=cut))
    assert [i.type for i in whole.output] == ["message"] and whole.status == "incomplete"
    assert whole.output_text == tokenizer.decode(ids[:cut])


def test_a_call_that_then_does_not_parse_ends_incomplete(server: ServerThread) -> None:
    """The reply stops by itself but its calls do not parse: the call that went out ends
    "incomplete", the response "completed" (chat's stream: "stop", no "tool_calls")."""
    written = CASES[server.case][1]  # type: ignore[attr-defined]
    reply = written.replace("}}\n</tool_call>\n", "}\n</tool_call>\n")  # a brace short
    reply = reply.replace("days=3)", "days=3) + 1")  # not a call
    assert reply != written
    say(server, reply)
    events = _events(openai_client(server.url))
    final = events[-1].response
    assert final.status == "completed" and final.incomplete_details is None
    statuses = [c["item"].status for c in _calls_of(events).values()]
    assert statuses and set(statuses) == {"incomplete"}
    assert "get_weather" not in final.output_text


def test_stored_and_background_objects_are_the_whole_answer(server: ServerThread) -> None:
    say(server, CASES[server.case][1])  # type: ignore[attr-defined]
    client = openai_client(server.url)
    streamed = _events(client)[-1].response
    assert client.responses.retrieve(streamed.id) == streamed  # stored as it completed
    created = client.responses.create(background=True, **_args())
    events = list(client.responses.retrieve(created.id, stream=True))
    assert [e.type for e in events if e.type in CALL_EVENTS].count(CALL_EVENTS[1]) == 2
    done = client.responses.retrieve(created.id)
    assert done == events[-1].response and done.status == "completed"
    assert _shape(done.output) == _shape(client.responses.create(**_args()).output)
