"""Hostile bytes get a 4xx naming the field (or an error frame), never a 500, and the server
goes on serving: deep nesting, numbers out of range, bogus encodings, unsupported fields."""

from __future__ import annotations

import gzip
import json
from typing import Any

import aiohttp
import pytest
from websockets.asyncio.client import connect

pytestmark = pytest.mark.anyio

JSON = {"Content-Type": "application/json"}
DEEP = 100_000  # far past the interpreter's recursion limit


def _deep(n: int = DEEP) -> str:
    return "[" * n + "]" * n


async def _post(
    url: str, path: str, data: bytes | str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.post(url + path, data=data, headers=headers or JSON) as resp:
            return resp.status, await resp.json()


def _raw_number(body: dict[str, Any], field: str, literal: str) -> str:
    """`body` as JSON with `field` set to a number literal json.dumps could not write."""
    text = json.dumps({**body, field: 0})
    return text.replace(f'"{field}": 0', f'"{field}": {literal}')


@pytest.mark.parametrize(
    ("path", "data", "param"),
    [
        ("/v1/completions", '{"prompt": "x", "temperature": ' + _deep() + "}", "temperature"),
        ("/v1/completions", '{"prompt": ' + _deep() + "}", "prompt[0][0]"),
        ("/v1/completions", '{"prompt": "x", "zzz": ' + _deep() + "}", "zzz"),
        ("/v1/chat/completions", '{"messages": [], "metadata": {"a": ' + _deep() + "}}", None),
        (
            "/v1/chat/completions",
            '{"messages": [], "tools": [{"a": ' + _deep() + "}]}",
            "tools[0].a",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [], "tools": [{"type": "function", "function": {"name": "f", '
            '"parameters": {"a": ' + _deep() + "}}}]}",
            "body",
        ),
        ("/v1/completions", '{"prompt": "x", "guided_json": {"a": ' + _deep() + "}}", "body"),
        ("/v1/completions", _deep(), "body"),
    ],
)
async def test_deep_nesting_is_a_400(server, path: str, data: str, param: str | None) -> None:  # type: ignore[no-untyped-def]
    status, body = await _post(server.url, path, data)
    assert status == 400, body
    if param is not None:
        assert body["error"]["param"] == param
    else:
        assert body["error"]["param"].startswith("metadata")


@pytest.mark.parametrize(
    ("field", "literal"),
    [
        ("temperature", "1" + "0" * 400),  # an integer beyond float range
        ("temperature", "1e400"),
        ("top_p", "-1" + "0" * 400),
        ("max_tokens", "1" + "0" * 400),
        ("seed", "1" + "0" * 30),
        ("top_k", "9" * 5000),  # past CPython's int-from-string digit limit
        ("priority", "1" + "0" * 20),
        ("temperature", "1e308"),  # finite in float64, inf in float32
        ("top_p", "1e-300"),  # 0 in float32
        ("min_p", "1e-40"),
        ("repetition_penalty", "1e31"),
        ("priority", str(2**31)),
        ("max_tokens", str(2**31)),
    ],
)
async def test_numbers_out_of_range_name_the_field(server, field: str, literal: str) -> None:  # type: ignore[no-untyped-def]
    data = _raw_number({"prompt": "x", "max_tokens": 2}, field, literal)
    status, body = await _post(server.url, "/v1/completions", data)
    assert status == 400, body
    assert body["error"]["param"] == field


@pytest.mark.parametrize(
    ("path", "body", "param", "text"),
    [
        ("/v1/completions", {"prompt": "x", "best_of": True}, "best_of", "int"),
        ("/v1/completions", {"prompt": "x", "best_of": 2, "stream": True}, "best_of", "stream"),
        ("/v1/completions", {"prompt": "x", "best_of": 0}, "best_of", ">= n"),
        ("/v1/completions", {"prompt": "x", "n": 2**31}, "n", ""),
        ("/v1/completions", {"prompt": "x", "n": True}, "n", "int"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content", ""),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": None}]},
            "messages[0].content",
            "",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
            "",
        ),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages[0].role", ""),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": -101}},
            "logit_bias",
            "[-100, 100]",
        ),
        ("/v1/completions", {"prompt": "x", "stop": ["a" * 513]}, "stop", "512"),
        ("/v1/completions", {"prompt": "x", "stream_options": {"x": 1}}, "stream_options.x", ""),
    ],
)
async def test_unsupported_or_missing_fields_are_named(  # type: ignore[no-untyped-def]
    server, path: str, body: dict[str, Any], param: str, text: str
) -> None:
    status, answer = await _post(server.url, path, json.dumps(body))
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert text in answer["error"]["message"]


async def test_content_encoding(server) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
    status, answer = await _post(
        server.url, "/v1/completions", body, {**JSON, "Content-Encoding": "bogus"}
    )
    assert (status, answer["error"]["param"]) == (415, "Content-Encoding")
    status, answer = await _post(
        server.url, "/v1/completions", b"not gzip", {**JSON, "Content-Encoding": "gzip"}
    )
    assert (status, answer["error"]["param"]) == (400, "body")
    status, answer = await _post(
        server.url, "/v1/completions", gzip.compress(body), {**JSON, "Content-Encoding": "gzip"}
    )
    assert status == 200 and answer["usage"]["completion_tokens"] <= 2


async def test_gzip_bomb_is_a_413(server) -> None:  # type: ignore[no-untyped-def]
    """The size limit counts decoded bytes: 40 MB of zeros, sent as 40 kB of gzip."""
    bomb = gzip.compress(b'{"prompt": "' + b"0" * 40_000_000 + b'"}')
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        headers = {**JSON, "Content-Encoding": "gzip"}
        async with http.post(f"{server.url}/v1/completions", data=bomb, headers=headers) as resp:
            assert resp.status == 413


async def test_websocket_frames_get_errors_and_the_socket_goes_on(server) -> None:  # type: ignore[no-untyped-def]
    url = server.url.replace("http://", "ws://") + "/v1/ws"
    frames = [
        # Too deep to decode at all: answered on the socket's level, like a frame not JSON.
        (_deep(), None, None),
        ('{"type": "generate", "request_id": "a", "prompt": ' + _deep() + "}", None, None),
        # Decoded, then typed: the nesting fails at its first bracket, named.
        (
            '{"type": "generate", "request_id": "b", "prompt": "x", "stop": ' + _deep(500) + "}",
            "b",
            "stop[0]",
        ),
        (
            _raw_number(
                {"type": "generate", "request_id": "c", "prompt": "x"},
                "temperature",
                "1" + "0" * 400,
            ),
            "c",
            "temperature",
        ),
        (
            json.dumps({"type": "generate", "request_id": "d", "prompt": "x", "top_p": 1e-300}),
            "d",
            "top_p",
        ),
        (
            json.dumps({"type": "generate", "request_id": "e", "messages": [{"role": "user"}]}),
            "e",
            "messages[0].content",
        ),
        (json.dumps({"type": ["generate"], "request_id": "f"}), "f", "type"),
        (json.dumps({"type": "generate", "request_id": "g", "prompt": [1, 2**70]}), "g", None),
    ]
    async with connect(url, max_size=None) as ws:
        for data, request_id, field in frames:
            await ws.send(data)
            frame = json.loads(await ws.recv())
            assert frame["type"] == "error" and frame["request_id"] == request_id, frame
            if field is not None:
                assert frame["field"] == field, frame
        await ws.send(json.dumps({"type": "generate", "request_id": "ok", "prompt": "x",
                                  "max_tokens": 3, "ignore_eos": True}))  # fmt: skip
        kinds = []
        while not kinds or kinds[-1] not in ("done", "error"):
            kinds.append(json.loads(await ws.recv())["type"])
        assert kinds[-1] == "done"
