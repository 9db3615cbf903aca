"""Responses input items -> chat messages (gateway/responses_input.py), without a server: the
calls of one assistant turn go into one message in the model's own format, the function's
output is a tool message, reasoning items are left out, and a bad item is a 400 naming it."""

from __future__ import annotations

from typing import Any

import pytest
from troupe.gateway.errors import ApiError
from troupe.gateway.responses_input import input_messages

CALLS: list[dict[str, Any]] = [
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
    {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "not json"},
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


@pytest.mark.parametrize(
    ("call_format", "calls"),
    [
        (
            "hermes",
            '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "g", "arguments": "not json"}\n</tool_call>',
        ),
        ("llama3_json", '{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": "not json"}'),
        (None, '[{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": "not json"}]'),
    ],
)  # fmt: skip
def test_a_tool_turn_becomes_chat_messages(call_format: Any, calls: str) -> None:
    assert input_messages(TURN, "Be brief.", call_format) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "Calling.\n" + calls},
        {"role": "tool", "content": "one"},
        {"role": "tool", "content": "two"},
    ]


def test_calls_without_text_before_them_are_a_message_of_their_own() -> None:
    items = [{"role": "user", "content": "Go"}, CALLS[0]]
    assert input_messages(items, None, None)[-1] == {
        "role": "assistant",
        "content": '[{"name": "f", "arguments": {"x": 1}}]',
    }
    assert input_messages("Go", None, None) == [{"role": "user", "content": "Go"}]


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([{"type": "function_call_output", "output": 3}], "input[0].output"),
        ([{"role": "user", "content": "a"}, {"type": "file_search_call"}], "input[1].type"),
        ([{"role": "user", "content": [{"type": "input_text"}]}], "input[0].content[0].text"),
        ([{"role": "user", "content": "a", "name": "x"}], "input[0].name"),
    ],
)
def test_a_bad_item_is_named(items: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(ApiError) as info:
        input_messages(items, None, "hermes")
    assert info.value.status == 400 and info.value.param == param
