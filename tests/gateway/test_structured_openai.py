"""Structured output over HTTP, driven by the official `openai` client (fake runner: its
tokens are bent to the grammar's masks, so whatever it writes must follow the constraint)."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI

SCHEMA = {
    "type": "object",
    "properties": {"size": {"enum": ["small", "large"]}, "ok": {"type": "boolean"}},
    "required": ["size", "ok"],
}
MESSAGES: Any = [{"role": "user", "content": "Describe it."}]


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _chat(client: OpenAI, **kw: Any) -> Any:
    args: dict[str, Any] = {"max_tokens": 48, "temperature": 1.0, "seed": 3, **kw}
    return client.chat.completions.create(model="", messages=MESSAGES, **args)


def test_chat_json_schema_whole_and_streamed(client: OpenAI) -> None:
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
    }
    out = _chat(client, response_format=fmt)
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    chunks = list(_chat(client, response_format=fmt, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content  # same seed, same constrained text


def test_chat_json_object_and_non_strict_schema(client: OpenAI) -> None:
    out = _chat(client, response_format={"type": "json_object"}, max_tokens=64)
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content or ""), dict)
    else:
        assert (out.choices[0].message.content or "").startswith("{")
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    out = _chat(client, response_format=fmt, seed=5)
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), SCHEMA)


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_regex": "[0-9]{2}-[a-c]{3}"}, lambda t: re.fullmatch("[0-9]{2}-[a-c]{3}", t)),
        ({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
        ({"guided_json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        (
            {"guided_json": json.dumps(SCHEMA)},
            lambda t: json.loads(t)["size"] in ("small", "large"),
        ),
        ({"guided_grammar": 'root ::= "x" [0-9] "y"'}, lambda t: re.fullmatch("x[0-9]y", t)),
        ({"structured_outputs": {"regex": "(ab|cd)+"}}, lambda t: re.fullmatch("(ab|cd)+", t)),
        ({"structured_outputs": {"choice": ["on", "off"]}}, lambda t: t in ("on", "off")),
        ({"structured_outputs": {"json": SCHEMA}}, lambda t: json.loads(t)["ok"] in (True, False)),
    ],
)
def test_vllm_extras_on_completions(client: OpenAI, extra: dict[str, Any], check: Any) -> None:
    out = client.completions.create(
        model="", prompt="Answer:", max_tokens=48, temperature=1.0, seed=1, extra_body=extra
    )
    text = out.choices[0].text
    if out.choices[0].finish_reason == "stop":
        assert check(text), text
    else:  # a repetition the grammar allows may run out of tokens; what came is still valid
        assert isinstance(extra.get("structured_outputs", {}).get("regex"), str), text


def test_completions_response_format(client: OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    out = client.completions.create(
        model="", prompt="JSON:", max_tokens=48, seed=2, extra_body={"response_format": fmt}
    )
    jsonschema.validate(json.loads(out.choices[0].text), SCHEMA)


ANSWER_TAG = {  # regex content: JSON content may run on in free whitespace under random draws
    "type": "tag",
    "begin": "<answer>",
    "content": {"type": "regex", "pattern": "[0-9]{2}-[a-c]{3}"},
    "end": "</answer>",
}


def test_structural_tags_whole_and_older_form(client: OpenAI) -> None:
    """response_format {"type": "structural_tag", "format"} (xgrammar's): the reply is the tag;
    vLLM's older structures + triggers: whatever follows a trigger is the structure."""
    fmt: Any = {"type": "structural_tag", "format": ANSWER_TAG}
    out = _chat(client, response_format=fmt, max_tokens=64)
    text = out.choices[0].message.content or ""
    assert out.choices[0].finish_reason == "stop", text
    assert re.fullmatch(r"<answer>[0-9]{2}-[a-c]{3}</answer>", text), text
    older = {
        "type": "structural_tag",
        "structures": [{"begin": "<size=", "schema": SCHEMA, "end": ">"}],
        "triggers": ["<size="],
    }
    out = client.completions.create(
        model="",
        prompt="Answer:",
        max_tokens=48,
        seed=4,
        extra_body={"structured_outputs": {"structural_tag": json.dumps(older)}},
    )
    for call in out.choices[0].text.split("<size=")[1:]:  # each structure the model ended
        if ">" in call:
            jsonschema.validate(json.loads(call[: call.index(">")]), SCHEMA)


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"response_format": {"type": "structural_tag"}}, "response_format"),
        (
            {"extra_body": {"structured_outputs": {"structural_tag": "{not json"}}},
            "structured_outputs.structural_tag",
        ),
        ({"extra_body": {"guided_regex": "(ab"}}, "guided_regex"),
        ({"extra_body": {"guided_json": {"type": "nonsense"}}}, "guided_json"),
        ({"extra_body": {"guided_json": "{not json"}}, "guided_json"),
        ({"extra_body": {"guided_grammar": 'root ::= "a" |'}}, "guided_grammar"),
        ({"extra_body": {"guided_choice": []}}, "guided_choice"),
        ({"extra_body": {"structured_outputs": {"regex": "(ab"}}}, "structured_outputs.regex"),
        ({"extra_body": {"structured_outputs": {"bogus": 1}}}, "structured_outputs.bogus"),
        ({"extra_body": {"guided_regex": "a", "guided_choice": ["a"]}}, "guided_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": 3}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"ignore_eos": True}},
            "ignore_eos",
        ),
    ],
)
def test_bad_structured_fields_are_400_naming_the_field(
    client: OpenAI, kw: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, **kw)
    body: Any = info.value.body
    assert body["param"] == param, body


@pytest.mark.anyio
async def test_websocket_frames_carry_structured_output(server) -> None:  # type: ignore[no-untyped-def]
    from websockets.asyncio.client import connect

    url = str(server.url).replace("http://", "ws://") + "/v1/ws"
    frames: dict[str, list[dict[str, Any]]] = {}
    async with connect(url) as ws:
        base = {"type": "generate", "prompt": "Hi", "max_tokens": 48, "temperature": 1.0}
        sent = {
            "j": {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            "c": {"structured_outputs": {"choice": ["up", "down"]}},
            "bad": {"guided_regex": "(ab"},
        }
        for rid, extra in sent.items():
            await ws.send(json.dumps({**base, "request_id": rid, **extra}))
        while len([f for fs in frames.values() for f in fs if f["type"] != "delta"]) < len(sent):
            frame = json.loads(await ws.recv())
            frames.setdefault(frame["request_id"], []).append(frame)
    text = {rid: "".join(f.get("text", "") for f in fs) for rid, fs in frames.items()}
    assert frames["j"][-1]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text["j"]), SCHEMA)
    assert text["c"] in ("up", "down")
    assert frames["bad"][-1]["type"] == "error" and frames["bad"][-1]["field"] == "guided_regex"
