"""Origins, content types, CORS, and the connection gate (cap, header and body deadlines)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import anyio
import pytest
from troupe.gateway.state import GatewaySettings
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

pytestmark = pytest.mark.anyio

BODY = {"prompt": "x", "max_tokens": 2}
HANG = 60  # s: only a hang detector; every wait below ends on an event


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/ws"


async def _ws_status(url: str, origin: str | None) -> int:
    """101 if the handshake is accepted, else the HTTP status it got."""
    try:
        async with connect(_ws(url), origin=origin) as ws:  # type: ignore[arg-type]
            await ws.send(json.dumps({"type": "generate", "request_id": "a", **BODY}))
            while json.loads(await ws.recv())["type"] == "delta":
                pass
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


async def test_websocket_origin(server) -> None:  # type: ignore[no-untyped-def]
    host = server.url.removeprefix("http://")
    assert await _ws_status(server.url, None) == 101  # a tool, not a page
    assert await _ws_status(server.url, f"http://{host}") == 101  # the playground
    assert await _ws_status(server.url, "https://evil.example") == 403
    assert await _ws_status(server.url, "null") == 403  # sandboxed frames, file:// pages
    listed = server.add_gateway(GatewaySettings(allowed_origins=("https://app.example",)))
    assert await _ws_status(listed, "https://app.example") == 101
    assert await _ws_status(listed, "https://APP.example:443") == 101
    assert await _ws_status(listed, "https://app.example:8443") == 403
    anyone = server.add_gateway(GatewaySettings(allowed_origins=("*",)))
    assert await _ws_status(anyone, "https://evil.example") == 101


async def test_a_page_elsewhere_cannot_spend_the_key(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(api_key="s3cret"))
    try:
        async with connect(_ws(url) + "?api_key=s3cret", origin="https://evil.example"):  # type: ignore[arg-type]
            raise AssertionError("a foreign page opened the websocket")
    except InvalidStatus as exc:
        assert exc.response.status_code == 403


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("text/plain", 415),  # what a cross-site <form> or no-cors fetch can send
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        (None, 415),
    ],
)
async def test_posts_must_be_json(server, content_type: str | None, status: int) -> None:  # type: ignore[no-untyped-def]
    headers = {} if content_type is None else {"Content-Type": content_type}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{server.url}/v1/completions", data=json.dumps(BODY), headers=headers
        ) as resp:
            assert resp.status == status
            if status == 415:
                assert (await resp.json())["error"]["param"] == "Content-Type"


async def test_cors_only_for_listed_origins(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(allowed_origins=("https://app.example",)))
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    async with aiohttp.ClientSession() as http:
        headers = {**preflight, "Origin": "https://app.example"}
        async with http.options(f"{url}/v1/completions", headers=headers) as resp:
            assert resp.status == 204
            assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "POST" in resp.headers["Access-Control-Allow-Methods"]
            assert "Authorization" in resp.headers["Access-Control-Allow-Headers"]
        headers = {**preflight, "Origin": "https://evil.example"}
        async with http.options(f"{url}/v1/completions", headers=headers) as resp:
            assert resp.status == 403
            assert "Access-Control-Allow-Origin" not in resp.headers
        headers = {"Origin": "https://app.example"}
        async with http.post(f"{url}/v1/completions", json=BODY, headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
        async with http.post(f"{server.url}/v1/completions", json=BODY, headers=headers) as resp:
            assert resp.status == 403  # the default server lists nobody
            assert (await resp.json())["error"]["code"] == "origin_not_allowed"
        async with http.get(f"{server.url}/health", headers=headers) as resp:
            assert resp.status == 200  # probes and the page are not /v1/*


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    data = b""
    while chunk := await reader.read(65536):
        data += chunk
    return data


async def test_a_slow_request_head_is_cut_off(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(header_timeout=0.5, keepalive_timeout=0.5))
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # ...and never the rest
    with anyio.fail_after(HANG):
        assert await _read_until_closed(reader) == b""  # closed without an answer
    writer.close()
    # Kept-alive connections: the next head is bounded the same way.
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /hea")
    with anyio.fail_after(HANG):
        data = await _read_until_closed(reader)
    assert data.startswith(b"HTTP/1.1 200") and data.count(b"HTTP/1.1") == 1
    writer.close()


async def test_a_slow_body_gets_408(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(body_timeout=0.5))
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"prompt": '
    )
    with anyio.fail_after(HANG):
        status = await reader.readline()
    assert status.startswith(b"HTTP/1.1 408"), status
    writer.close()


async def test_connections_over_the_cap_get_503(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(max_connections=2))
    host, port = url.removeprefix("http://").split(":")
    held = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
    for r, w in held:  # an answer proves the server has taken the connection in
        w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        with anyio.fail_after(HANG):
            assert (await r.readline()).startswith(b"HTTP/1.1 200")
    reader, writer = await asyncio.open_connection(host, int(port))
    with anyio.fail_after(HANG):
        answer = await _read_until_closed(reader)
    assert answer.startswith(b"HTTP/1.1 503")
    body: dict[str, Any] = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "overloaded"
    writer.close()
    for _, w in held:
        w.close()
    # Once the held connections are gone, the server takes new ones again.
    async with aiohttp.ClientSession() as http:
        with anyio.fail_after(HANG):
            while True:
                try:
                    async with http.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass  # closed before the server saw the others go
                await asyncio.sleep(0.01)


def _key_protocol(key: str) -> str:
    return "troupe.key." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


async def test_websocket_key_as_a_subprotocol(server) -> None:  # type: ignore[no-untyped-def]
    """The page's way: the key never appears in a URL, and is never echoed back."""
    url = server.add_gateway(GatewaySettings(api_key="s3cret ✓"))
    async with connect(_ws(url), subprotocols=["troupe.v1", _key_protocol("s3cret ✓")]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "troupe.v1"
        await ws.send(json.dumps({"type": "generate", "request_id": "a", **BODY}))
        while (frame := json.loads(await ws.recv()))["type"] == "delta":
            pass
        assert frame["type"] == "done"
    refused = {
        ("troupe.v1", _key_protocol("wrong")): 401,
        ("troupe.v1", "troupe.key.a"): 401,  # not base64
        (_key_protocol("s3cret ✓"),): 400,  # nothing to select: the key would be logged
        ("troupe.v1",): 401,
    }
    for protocols, status in refused.items():
        try:
            async with connect(_ws(url), subprotocols=list(protocols)):  # type: ignore[arg-type]
                raise AssertionError(f"opened with {protocols}")
        except InvalidStatus as exc:
            assert exc.response.status_code == status, protocols
