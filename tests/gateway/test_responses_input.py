"""Responses input items -> chat messages (gateway/responses_input.py), without a server: the
calls of one assistant turn go into one message as its `tool_calls`, beside the text before
them, the function's output is a tool message answering its call id, a reasoning item's text is
the reasoning of the assistant turn after it (dropped where no turn follows), and a bad item
(arguments that are not a JSON object too) is a 400 naming it."""

from __future__ import annotations

from typing import Any

import pytest
from troupe.gateway.errors import ApiError
from troupe.gateway.responses_input import input_messages
from troupe.messages import ChatMessage, ToolCall, ToolCallFunction

CALLS: list[dict[str, Any]] = [
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
    {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
]
TURN: list[dict[str, Any]] = [
    {"role": "user", "content": "Go"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
    {"type": "message", "role": "assistant", "id": "m", "status": "completed",
     "content": [{"type": "output_text", "text": "Calling.\n", "annotations": [], "logprobs": []}]},
    *CALLS,
    {"type": "function_call_output", "call_id": "c1", "output": "one"},
    {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
]  # fmt: skip


def _call(call_id: str, name: str, arguments: str) -> ToolCall:
    return ToolCall(id=call_id, function=ToolCallFunction(name=name, arguments=arguments))


def test_a_tool_turn_becomes_chat_messages() -> None:
    assert input_messages(TURN, "Be brief.") == [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Go"),
        ChatMessage(
            role="assistant",
            content="Calling.\n",
            tool_calls=(_call("c1", "f", '{"x": 1}'), _call("c2", "g", "{}")),
            reasoning="hm",
        ),
        ChatMessage(role="tool", content="one", tool_call_id="c1"),
        ChatMessage(role="tool", content="two", tool_call_id="c2"),
    ]


def test_calls_without_text_before_them_are_a_message_of_their_own() -> None:
    items = [
        {"role": "user", "content": "Go"},
        CALLS[0],
        {"role": "user", "content": "Hm"},
        CALLS[1],
    ]
    assert input_messages(items, None)[1:] == [
        ChatMessage(role="assistant", tool_calls=(_call("c1", "f", '{"x": 1}'),)),
        ChatMessage(role="user", content="Hm"),
        ChatMessage(role="assistant", tool_calls=(_call("c2", "g", "{}"),)),
    ]
    assert input_messages("Go", None) == [ChatMessage(role="user", content="Go")]


def _thinking(*texts: str) -> dict[str, Any]:
    parts = [{"type": "reasoning_text", "text": text} for text in texts]
    return {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "S"}],
        "content": parts,
    }


def test_thinking_goes_to_the_turn_after_it() -> None:
    """An agent loop as a Responses client sends it back: each round's thinking belongs to
    its calls or its answer; the summary is not the thinking; thinking before a user message
    (no turn of the model's follows it) and an empty item are dropped."""
    items = [
        {"role": "user", "content": "Go"},
        _thinking("a", "b"),
        CALLS[0],
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        _thinking(),
        _thinking("c"),
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Done."}],
        },
        _thinking("lost"),
        {"role": "user", "content": "Again"},
    ]
    assert input_messages(items, None) == [
        ChatMessage(role="user", content="Go"),
        ChatMessage(role="assistant", tool_calls=(_call("c1", "f", '{"x": 1}'),), reasoning="a\nb"),
        ChatMessage(role="tool", content="one", tool_call_id="c1"),
        ChatMessage(role="assistant", content="Done.", reasoning="c"),
        ChatMessage(role="user", content="Again"),
    ]


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([{"type": "function_call_output", "output": 3}], "input[0].output"),
        ([{"role": "user", "content": "a"}, {"type": "file_search_call"}], "input[1].type"),
        ([{"role": "user", "content": [{"type": "input_text"}]}], "input[0].content[0].text"),
        ([{"role": "user", "content": "a", "name": "x"}], "input[0].name"),
        ([{**CALLS[0], "arguments": "not json"}], "input[0].arguments"),
        ([CALLS[0], {**CALLS[1], "arguments": "[1]"}], "input[1].arguments"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        ([{"type": "reasoning", "content": [{"type": "reasoning_text"}]}], "input[0].content[0]"),
        (
            [CALLS[0], {"type": "reasoning", "content": [{"type": "x", "text": ""}]}],
            "input[1].content[0]",
        ),
    ],
)
def test_a_bad_item_is_named(items: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(ApiError) as info:
        input_messages(items, None)
    assert info.value.status == 400 and info.value.param == param
