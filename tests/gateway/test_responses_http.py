"""POST /v1/responses with the official `openai` client against the fake-runner server: the
answer is chat's (same prompt, same text and usage as /v1/chat/completions, whole and
streamed), the objects parse as the client's own models, the stream's events come in the
Responses API's order with consecutive sequence numbers, `text.format` constrains the output,
max_output_tokens makes an incomplete response, and bad requests are 400s naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import BASE_CONFIG, ServerThread, openai_client

SCHEMA = {
    "type": "object",
    "properties": {"size": {"enum": ["small", "large"]}, "ok": {"type": "boolean"}},
    "required": ["size", "ok"],
}
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 8}


@pytest.fixture(scope="module")
def client(server: ServerThread) -> OpenAI:
    return openai_client(server.url, timeout=60)


def _chat(client: OpenAI, messages: list[dict[str, str]], max_tokens: int) -> Any:
    return client.chat.completions.create(
        model="",
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,  # type: ignore[arg-type]
    )


def _events(client: OpenAI, **kw: Any) -> list[Any]:
    return list(client.responses.create(stream=True, **kw))


def test_text_is_chats_answer_and_parses_as_a_response(
    client: OpenAI, server: ServerThread
) -> None:
    chat = _chat(client, [{"role": "user", "content": "Hello there"}], 8)
    raw = client.responses.with_raw_response.create(model="", input="Hello there", **GREEDY)
    body = raw.http_response.json()
    out = Response.model_validate(body)  # strict: every field the client's model requires
    assert out.id.startswith("resp_") and out.object == "response"
    assert out.model == server.engine.model_name
    assert [item.type for item in out.output] == ["message"]
    assert out.output_text == chat.choices[0].message.content
    assert out.status == (
        "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    )
    assert out.usage is not None and chat.usage is not None
    assert out.usage.input_tokens == chat.usage.prompt_tokens
    assert out.usage.output_tokens == chat.usage.completion_tokens
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert out.usage.output_tokens_details.reasoning_tokens == 0
    # the settings it ran with
    assert (out.temperature, out.top_p, out.max_output_tokens) == (0.0, 1.0, 8)
    assert (out.tool_choice, out.tools, out.parallel_tool_calls) == ("auto", [], True)
    assert body["text"] == {"format": {"type": "text"}} and body["instructions"] is None


def test_the_stream_builds_the_same_answer(client: OpenAI) -> None:
    whole = client.responses.create(model="", input="Tell me a story", **GREEDY)
    events = _events(client, model="", input="Tell me a story", **GREEDY)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(d.delta for d in deltas)
    assert text == whole.output_text
    assert events[-4].text == text
    item = events[-2].item
    assert item.id == events[2].item.id == deltas[0].item_id
    final = events[-1].response
    assert final.id == events[0].response.id and final.output_text == text
    assert final.status == whole.status and final.usage is not None and whole.usage is not None
    assert final.usage.output_tokens == whole.usage.output_tokens >= len(deltas)
    # the client's stream helper takes the same events
    with client.responses.stream(model="", input="Tell me a story", **GREEDY) as stream:
        helped = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        assert stream.get_final_response().output_text == helped == text


def test_instructions_and_message_items_render_as_chat(client: OpenAI) -> None:
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a color."},
    ]
    chat = _chat(client, messages, 8)
    out = client.responses.create(
        model="",
        instructions="Answer briefly.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"type": "message", "role": "user", "content": "Name a color."},
        ],
        **GREEDY,
    )
    assert out.instructions == "Answer briefly."
    assert out.usage is not None and chat.usage is not None
    assert out.usage.input_tokens == chat.usage.prompt_tokens
    assert out.output_text == chat.choices[0].message.content


def test_json_schema_output_follows_the_schema(client: OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}
    args: dict[str, Any] = {"model": "", "input": "Describe it.", "text": {"format": fmt}}
    args |= {"max_output_tokens": 48, "temperature": 1.0, "extra_body": {"seed": 3}}
    out = client.responses.create(**args)
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), SCHEMA)
    assert out.text is not None and out.text.format is not None
    assert out.text.format.type == "json_schema"
    events = _events(client, **args)
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == out.output_text  # same seed, same constrained text
    obj = client.responses.create(
        model="",
        input="Describe it.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=64,
        extra_body={"seed": 5},
    )
    if obj.status == "completed":
        assert isinstance(json.loads(obj.output_text), dict)
    else:
        assert obj.output_text.startswith("{")


def test_max_output_tokens_makes_an_incomplete_response(client: OpenAI) -> None:
    args: dict[str, Any] = {"model": "", "input": "Count.", "max_output_tokens": 3}
    args["extra_body"] = {"ignore_eos": True}
    out = client.responses.create(**args)
    assert out.status == "incomplete"
    assert out.incomplete_details is not None
    assert out.incomplete_details.reason == "max_output_tokens"
    assert out.usage is not None and out.usage.output_tokens == 3
    assert out.output[0].type == "message" and out.output[0].status == "incomplete"
    events = _events(client, **args)
    assert events[-1].type == "response.completed"  # as vLLM ends it: the helpers end too
    assert events[-1].response.status == "incomplete"
    assert events[-2].item.status == "incomplete"


def test_store_and_metadata_are_accepted(client: OpenAI) -> None:
    out = client.responses.create(
        model="", input="Hi", store=True, metadata={"run": "7"}, max_output_tokens=2
    )
    assert out.metadata == {"run": "7"}
    out = client.responses.create(model="", input="Hi", store=False, max_output_tokens=2)
    assert out.metadata == {}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user"}]}, "input[0].content"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].image_url.url",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        (
            {
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "tool_choice.name",
        ),
        ({"tools": [{"type": "function", "name": "f"}]}, "tool_choice"),  # no "auto" format
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(
    client: OpenAI, extra: dict[str, Any], param: str
) -> None:
    body: dict[str, Any] = {"input": "Hi", **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/responses", body=body, cast_to=object)
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == param, error


def test_an_unknown_model_is_a_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="gpt-9", input="Hi", max_output_tokens=2)
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "model_not_found"


@pytest.fixture(scope="module")
def lora() -> Iterator[ServerThread]:
    config = BASE_CONFIG.replace(lora_modules=("sql=/adapters/sql",))
    srv = ServerThread(config, GatewaySettings()).start()
    yield srv
    srv.shutdown()


def test_the_model_may_name_a_lora_adapter(lora: ServerThread) -> None:
    client = OpenAI(base_url=f"{lora.url}/v1", api_key="unused", max_retries=0, timeout=60)
    assert client.responses.create(model="sql", input="Hi", max_output_tokens=2).model == "sql"
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="nosql", input="Hi", max_output_tokens=2)
    assert "'sql'" in info.value.message
