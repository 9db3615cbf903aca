"""OutputAssembler on its own, tool_choice "auto" streamed a few characters at a time (Hermes):
thinking then calls (the reasoning item closes when the first call opens), text between and
after calls (it joins the reply's one message, which stays open while calls stream, so the
final items are the whole answer's), and a running response's output so far (every item open,
"in_progress", in output_index order)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from troupe.gateway.reasoning import ReasoningSplitter
from troupe.gateway.responses_objects import ResponseShape
from troupe.gateway.responses_output import OutputAssembler
from troupe.gateway.tool_auto import TOOL_PARSERS
from troupe.gateway.tool_calls import ToolPlan
from troupe.messages import Delta, Finished, FinishReason, Timings, Usage

from tests.gateway.test_tool_stream import TOOLS as STREAM_TOOLS
from tests.gateway.test_tool_stream import replies

TOOLS = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)
PLAN = ToolPlan(spec=None, tools=TOOLS, parser="hermes")
BLOCK = '<tool_call>\n{"name": "f", "arguments": {"n":%d}}\n</tool_call>'


def _assembler(is_streaming: bool, splitter: ReasoningSplitter | None = None) -> OutputAssembler:
    shape = ResponseShape("resp_x", "m", {})
    return OutputAssembler(shape, PLAN, splitter, is_streaming=is_streaming)


def _finished(reason: FinishReason = FinishReason.STOP) -> Finished:
    usage = Usage(prompt_tokens=1, completion_tokens=1)
    timings = Timings(ttft=None, tpot=None, e2e=0.0)
    return Finished(
        request_id="r", text="", token_ids=(), finish_reason=reason, usage=usage, timings=timings
    )


def _feed(assembler: OutputAssembler, reply: str, step: int = 3) -> list[dict[str, Any]]:
    events = assembler.start()
    for at in range(0, len(reply), step):
        events += assembler.feed(Delta(request_id="r", text=reply[at : at + step], token_ids=(1,)))
    return events + assembler.feed(_finished())


def _shape(output: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (i["type"], i["status"], i.get("arguments"), [c["text"] for c in i.get("content", [])])
        for i in output
    ]


def test_text_between_and_after_calls_joins_the_one_message() -> None:
    reply = f"Sure. {BLOCK % 1}\n  then {BLOCK % 2} done.\n"
    streamed = _assembler(True)
    events = _feed(streamed, reply)
    whole = _assembler(False)
    _feed(whole, reply)
    assert streamed.response is not None and whole.response is not None
    assert (
        _shape(streamed.response["output"])
        == _shape(whole.response["output"])
        == [
            ("message", "completed", None, ["Sure. then  done."]),
            ("function_call", "completed", '{"n": 1}', []),
            ("function_call", "completed", '{"n": 2}', []),
        ]
    )
    text = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    first_call = next(n for n, e in enumerate(events) if e["type"].endswith("arguments.delta"))
    said_after = [
        e for e in events[first_call:] if e["type"] == "response.output_text.delta"
    ]  # streamed as it came, into message 0
    assert "".join(text) == "Sure. then  done." and said_after
    assert {e["output_index"] for e in said_after} == {0}
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert done == [0, 1, 2]


def test_thinking_closes_when_the_first_call_opens() -> None:
    splitter = ReasoningSplitter("qwen3", "")
    assembler = _assembler(True, splitter)
    events = _feed(assembler, "<think>\nhm\n</think>\n\n" + BLOCK % 7)
    kinds = [(e["type"], e.get("output_index")) for e in events]
    reasoning_done = kinds.index(("response.output_item.done", 0))
    call_added = kinds.index(("response.output_item.added", 1))
    assert reasoning_done < call_added  # thinking is over before the call opens
    assert assembler.response is not None
    assert _shape(assembler.response["output"]) == [
        ("reasoning", "completed", None, ["\nhm\n"]),
        ("function_call", "completed", '{"n": 7}', []),
    ]


def test_output_so_far_while_calls_stream() -> None:
    assembler = _assembler(True)
    assembler.start()
    partial = BLOCK[:41]  # the second call's arguments begun: '{"'
    assembler.feed(Delta(request_id="r", text="Sure. " + BLOCK % 1 + partial, token_ids=(1,)))
    now = assembler.output_so_far()
    assert [(i["type"], i["status"]) for i in now] == [
        ("message", "in_progress"),
        ("function_call", "in_progress"),
        ("function_call", "in_progress"),
    ]
    assert now[1]["arguments"] == '{"n": 1}' and now[2]["arguments"] == '{"'


def _call_events(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each function_call item's deltas put together, its `.done` arguments and done item."""
    calls: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call":
            calls[e["output_index"]] = {"deltas": ""}
        elif e["type"] == "response.function_call_arguments.delta":
            calls[e["output_index"]]["deltas"] += e["delta"]
        elif e["type"] == "response.function_call_arguments.done":
            calls[e["output_index"]]["arguments"] = e["arguments"]
        elif e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call":
            calls[e["output_index"]]["item"] = e["item"]
    return calls


def _canonical(arguments: str) -> bool:
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False) == arguments
    except ValueError:
        return False


@pytest.mark.parametrize("parser", TOOL_PARSERS)
@settings(max_examples=12, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_format_streams_to_the_whole_answer(parser: str, data: st.DataObject) -> None:
    """Replies in each format (tests/gateway/test_tool_stream.py's, broken or cut at times),
    in any deltas: each call's pieces put together are its `.done` and final arguments; where
    the whole answer has calls, the streamed one has them with the same names and arguments,
    to the byte (Hermes arguments written as a JSON string: the same JSON), and the same text."""
    _, deltas, stopped = data.draw(replies(parser))
    plan = ToolPlan(spec=None, tools=tuple(STREAM_TOOLS), parser=parser)  # type: ignore[arg-type]
    outs = []
    for is_streaming in (True, False):
        assembler = OutputAssembler(
            ResponseShape("r", "m", {}), plan, None, is_streaming=is_streaming
        )
        events = assembler.start()
        for delta in deltas:
            events += assembler.feed(Delta(request_id="r", text=delta, token_ids=(1,)))
        reason = FinishReason.STOP if stopped else FinishReason.LENGTH
        events += assembler.feed(_finished(reason))
        assert assembler.response is not None
        outs.append((events, assembler.response["output"]))
    (events, streamed), (_, whole) = outs
    calls = _call_events(events)
    for index, call in calls.items():
        assert call["deltas"] == call["arguments"] == call["item"]["arguments"]
        assert streamed[index]["arguments"] == call["arguments"]
    whole_calls = [i for i in whole if i["type"] == "function_call"]
    streamed_calls = [i for i in streamed if i["type"] == "function_call"]
    if whole_calls:
        assert [c["name"] for c in streamed_calls] == [c["name"] for c in whole_calls]
        for got, want in zip(streamed_calls, whole_calls, strict=True):
            if parser == "hermes" and not _canonical(want["arguments"]):
                assert json.loads(got["arguments"]) == json.loads(want["arguments"])
            else:
                assert got["arguments"] == want["arguments"]
        texts = [_shape([i]) for i in streamed if i["type"] == "message"]
        assert texts == [_shape([i]) for i in whole if i["type"] == "message"]
    elif not streamed_calls:  # no call went out: the text, as whole
        assert _shape(streamed) == _shape(whole)
    else:  # a call went out, the reply then went wrong: it ends "incomplete"
        assert {c["status"] for c in streamed_calls} == {"incomplete"}
