"""A multi-turn agent loop over HTTP with the official `openai` client, on Qwen2.5's real chat
template (SmolLM2's tokenizer, a fake runner made to say exact replies): the model's two calls
come back as `tool_calls`, the client sends that message back as it got it with the tools'
results, and the engine runs exactly the prompt transformers renders from the dicts vLLM hands
it (the token ids of /tokenize and usage agree); the websocket takes the same messages; a bad
shape is a 400 naming its field."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from troupe.gateway.errors import ApiError
from troupe.gateway.openai_requests import OpenAIRequest, parse_request
from troupe.gateway.state import GatewaySettings
from troupe.messages import ChatMessage, ToolCall, ToolCallFunction
from websockets.asyncio.client import connect

from tests.actors.core.test_chat_tool_messages import QWEN, TOOLS, TURN, hf_render, vllm_dicts
from tests.gateway.conftest import ServerThread, openai_client, scripted_server
from tests.gateway.scripted_runner import say, template_model

QUESTION = TURN[:2]  # system, user
CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = template_model(tmp_path_factory.mktemp("qwen-model"), QWEN)
    srv = scripted_server(folder, GatewaySettings()).start()
    yield srv
    srv.shutdown()


def _post(server: ServerThread, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _parse(messages: list[Any]) -> OpenAIRequest:
    body = json.dumps({"messages": messages}).encode()
    return parse_request("chat", body, default_max_tokens=8)


def _results(calls: list[Any]) -> list[dict[str, Any]]:
    answers = {"get_weather": "Sunny, 24 C", "get_time": "14:05"}
    return [
        {"role": "tool", "tool_call_id": c.id, "content": answers[c.function.name]} for c in calls
    ]


def test_an_agent_loop_runs_the_prompt_transformers_renders(qwen: ServerThread) -> None:
    client = openai_client(qwen.url)
    say(qwen, CALLS)
    first = client.chat.completions.create(
        model="",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=96,
    )
    message = first.choices[0].message
    calls = message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls" and message.content is None
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]  # type: ignore[union-attr]

    say(qwen, "Sunny, 14:05.")
    history: list[Any] = [*QUESTION, message, *_results(calls)]  # the message as it came
    second = client.chat.completions.create(
        model="",
        messages=history,
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=16,
    )
    assert second.choices[0].message.content == "Sunny, 14:05."

    # what the client sent, as plain JSON: the assistant's content null, its calls' arguments
    # as text; transformers gets them as vLLM hands them over (arguments parsed)
    sent = [*QUESTION, message.model_dump(exclude_unset=True), *_results(calls)]
    assert sent[2]["content"] is None and isinstance(calls[0].function.arguments, str)  # type: ignore[union-attr]
    text = hf_render(QWEN, vllm_dicts(sent), tools=TOOLS, add_generation_prompt=True)
    assert '"arguments": {"tz": "Europe/Paris"}}\n</tool_call><|im_end|>' in text
    want = qwen.engine.tokenizer.encode(text, False)
    assert second.usage is not None and second.usage.prompt_tokens == len(want)
    status, tokens = _post(
        qwen, "/tokenize", {"messages": sent, "chat_template_kwargs": {"tools": TOOLS}}
    )
    assert status == 200 and tokens["tokens"] == want

    # the tools reach the template whatever tool_choice says (vLLM's): the same prompt
    say(qwen, "Done.")
    none = client.chat.completions.create(
        model="",
        messages=history,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="none",
        max_tokens=16,
    )
    assert none.usage is not None and none.usage.prompt_tokens == len(want)


@pytest.mark.anyio
async def test_the_websocket_takes_the_same_messages(qwen: ServerThread) -> None:
    say(qwen, "Sunny.")
    text = hf_render(QWEN, vllm_dicts(TURN), tools=TOOLS, add_generation_prompt=True)
    want = len(qwen.engine.tokenizer.encode(text, False))
    frame = {
        "type": "generate",
        "request_id": "t1",
        "messages": TURN,
        "chat_template_kwargs": {"tools": TOOLS},
        "max_tokens": 8,
    }
    bad = {**frame, "request_id": "t2", "messages": [*TURN[:3], {**TURN[3], "role": "user"}]}
    async with connect(qwen.url.replace("http://", "ws://") + "/v1/ws") as ws:
        await ws.send(json.dumps(frame))
        await ws.send(json.dumps(bad))
        frames: dict[str, dict[str, Any]] = {}
        while len(frames) < 2:
            got = json.loads(await ws.recv())
            if got["type"] in ("done", "error"):
                frames[got["request_id"]] = got
    assert frames["t1"]["type"] == "done", frames["t1"]
    assert frames["t1"]["usage"]["prompt_tokens"] == want
    assert frames["t2"]["type"] == "error"
    assert "messages[3].tool_call_id" in frames["t2"]["message"]


def test_a_bad_tool_message_is_a_400_naming_its_field(qwen: ServerThread) -> None:
    client = openai_client(qwen.url)
    bad_arguments: list[Any] = [
        *QUESTION,
        {**TURN[2], "tool_calls": [{**TURN[2]["tool_calls"][0], "function": {"name": "get_weather", "arguments": "{'city': 1}"}}]},
    ]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="", messages=bad_arguments, max_tokens=4)
    body: Any = info.value.body
    assert body["param"] == "messages[2].tool_calls[0].function.arguments", body
    assert "JSON object" in body["message"]


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": None}, "messages[2].content"),
        ({"role": "assistant"}, "messages[2].content"),
        ({"role": "assistant", "content": None, "tool_calls": []}, "messages[2].content"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "messages[2].tool_call_id"),
        ({"role": "tool", "content": "x", "tool_calls": TURN[2]["tool_calls"]}, "messages[2].tool_calls"),
        ({"role": "user", "content": "x", "reasoning_content": "hm"}, "messages[2].reasoning_content"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}, "messages[2].tool_calls[0].function.arguments"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}, "messages[2].tool_calls[0].function.arguments"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"arguments": "{}"}}]}, "messages[2].tool_calls[0].function.name"),
        ({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}, "messages[2].tool_calls[0].id"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "function": {"name": "f", "arguments": "{}"}}]}, "messages[2].tool_calls[0].type"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "index": 0, "function": {"name": "f", "arguments": "{}"}}]}, "messages[2].tool_calls[0].index"),
        ({"role": "assistant", "tool_calls": {"id": "c"}}, "messages[2].tool_calls"),
        ({"role": "tool", "tool_call_id": 7, "content": "x"}, "messages[2].tool_call_id"),
        ({"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url"}]}, "messages[2].content[0].image_url"),
    ],
)  # fmt: skip
def test_bad_shapes_are_named(message: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        _parse([*QUESTION, message])
    assert info.value.status == 400 and info.value.param == param, info.value.message


def test_what_the_engine_gets() -> None:
    """Content parts join a line apart (vLLM's); the calls and ids come through typed; `reasoning` (vLLM's) and
    `reasoning_content` (what a reasoning parser returned) are one field."""
    messages = [
        *QUESTION,
        {**TURN[2], "content": [{"type": "text", "text": "Let me "}, {"type": "text", "text": "check."}], "reasoning": "Hm."},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": [{"type": "text", "text": "Sunny"}]},
    ]  # fmt: skip
    req = _parse(messages)
    calls = tuple(
        ToolCall(id=c["id"], function=ToolCallFunction(**c["function"]))
        for c in TURN[2]["tool_calls"]
    )
    assert req.prompt == [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="user", content="Weather and time in Paris?"),
        ChatMessage(role="assistant", content="Let me \ncheck.", tool_calls=calls, reasoning="Hm."),
        ChatMessage(role="tool", content="Sunny", tool_call_id="call_1", name="get_weather"),
    ]
