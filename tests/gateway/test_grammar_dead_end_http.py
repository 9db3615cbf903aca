"""A grammar that dead-ends after a free part (`[ab]\\x04`: the default model's vocabulary has no
token starting with 0x04) is the client's error, not the server's: a non-streamed request
answers 400 naming the field that carried the grammar, a streamed one sends that error once,
then [DONE], and a websocket request its error frame (fake runner, bent to the masks)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

pytestmark = pytest.mark.anyio
DEAD = "[ab]\\x04"
# a JSON string can hold no raw 0x04, but U+7D936 (bytes f1 bd a4 b6): no token starts with 0xf1
DEAD_SCHEMA = {"type": "string", "pattern": "^[ab]\U0007d936$"}
WHY = "its grammar cannot be continued after the text so far"


def _check_error(error: dict[str, Any], param: str, byte: str) -> None:
    assert error["type"] == "invalid_request_error" and error["code"] == "grammar_dead_end"
    assert error["param"] == param
    assert error["message"].startswith(f"invalid '{param}': {WHY}"), error
    assert f"next it allows only byte {byte}," in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "param", "byte"),
    [
        ("/v1/chat/completions", {"guided_regex": DEAD}, "guided_regex", "0x04"),
        (
            "/v1/completions",
            {"structured_outputs": {"regex": DEAD}},
            "structured_outputs.regex",
            "0x04",
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": DEAD_SCHEMA}}},
            "response_format.json_schema.schema",
            "0xf1",
        ),
        (
            "/v1/responses",
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": DEAD_SCHEMA}}},
            "text.format.schema",
            "0xf1",
        ),
    ],
)
async def test_non_streamed_dead_end_is_a_400_naming_the_field(  # type: ignore[no-untyped-def]
    server, path: str, body: dict[str, Any], param: str, byte: str
) -> None:
    if path == "/v1/completions":
        prompt: dict[str, Any] = {"prompt": "Say:"}
    elif path == "/v1/responses":
        prompt = {"input": "Say:"}
    else:
        prompt = {"messages": [{"role": "user", "content": "Say:"}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}{path}", json={**prompt, **body}) as resp:
            answer = await resp.json()
            assert resp.status == 400, answer
    _check_error(answer["error"], param, byte)


async def _sse(resp: aiohttp.ClientResponse) -> list[str]:
    payloads = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            payloads.append(line[6:])
    return payloads


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_streamed_dead_end_sends_the_error_once_then_done(server, path: str) -> None:  # type: ignore[no-untyped-def]
    body: dict[str, Any] = {"guided_regex": DEAD, "stream": True, "max_tokens": 8}
    if path == "/v1/completions":
        body["prompt"] = "Say:"
    else:
        body["messages"] = [{"role": "user", "content": "Say:"}]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}{path}", json=body) as resp:
            assert resp.status == 200
            payloads = await _sse(resp)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    errors = [c for c in chunks if "error" in c]
    assert len(errors) == 1 and chunks[-1] is errors[0], chunks
    _check_error(errors[0]["error"], "guided_regex", "0x04")
    choices = [c["choices"][0] for c in chunks[:-1] if c["choices"]]
    text = "".join(ch.get("text") or (ch.get("delta") or {}).get("content") or "" for ch in choices)
    assert text in ("a", "b")  # the free part, and nothing the grammar refused


async def test_websocket_error_frame_names_the_cause_and_others_finish(server) -> None:  # type: ignore[no-untyped-def]
    from websockets.asyncio.client import connect

    url = str(server.url).replace("http://", "ws://") + "/v1/ws"
    ends: dict[str, dict[str, Any]] = {}
    async with connect(url) as ws:
        base = {"type": "generate", "prompt": "Say:", "max_tokens": 8, "temperature": 0.0}
        await ws.send(json.dumps({**base, "request_id": "dead", "guided_regex": DEAD}))
        await ws.send(json.dumps({**base, "request_id": "ok", "guided_regex": "[0-9]{2}"}))
        while len(ends) < 2:
            frame = json.loads(await ws.recv())
            if frame["type"] != "delta":
                assert frame["request_id"] not in ends, frame  # one end each
                ends[frame["request_id"]] = frame
    dead = ends["dead"]
    assert dead["type"] == "error" and dead["code"] == "grammar_dead_end"
    assert dead["field"] == "guided_regex" and dead["message"].startswith(WHY)
    assert ends["ok"]["type"] == "done" and ends["ok"]["finish_reason"] == "stop"
