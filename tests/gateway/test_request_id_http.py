"""vLLM's client-named request ids: X-Request-Id (or the body's request_id) is the answer's id
after its prefix, whole and streamed; two requests in flight may share one (the engine's ids
differ); an id past the limit is a 400 naming where it came from."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import anyio
import pytest
from troupe.gateway.settings import GatewaySettings

from tests.gateway.test_http import read_sse

pytestmark = pytest.mark.anyio

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def _post(
    server: Any, route: str, body: dict[str, Any], header: str | None = None
) -> tuple[int, Any]:
    headers = {} if header is None else {"X-Request-Id": header}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}{route}", json=body, headers=headers) as resp:
            if body.get("stream") and resp.status == 200:
                return resp.status, [json.loads(p) for p in (await read_sse(resp))[:-1]]
            return resp.status, await resp.json()


async def test_the_clients_id_names_the_answer(server) -> None:  # type: ignore[no-untyped-def]
    status, whole = await _post(server, "/v1/chat/completions", CHAT, header="trace-7")
    assert status == 200 and whole["id"] == "chatcmpl-trace-7"
    body = {"prompt": "Hi", "max_tokens": 3, "request_id": "job-1", "stream": True}
    status, chunks = await _post(server, "/v1/completions", body)
    assert status == 200 and {c["id"] for c in chunks} == {"cmpl-job-1"}
    status, whole = await _post(server, "/v1/completions", body | {"stream": False}, "hdr")
    assert status == 200 and whole["id"] == "cmpl-hdr"  # the header wins, as in vLLM
    status, whole = await _post(server, "/v1/chat/completions", CHAT)
    assert status == 200 and whole["id"].startswith("chatcmpl-") and len(whole["id"]) > 20


async def test_two_requests_in_flight_may_share_an_id(server) -> None:  # type: ignore[no-untyped-def]
    answers: list[tuple[int, Any]] = []

    async def one() -> None:
        answers.append(await _post(server, "/v1/chat/completions", CHAT, header="same"))

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(one)
    assert [(status, body["id"]) for status, body in answers] == [(200, "chatcmpl-same")] * 4


@pytest.mark.parametrize(
    ("body", "header", "param"),
    [
        ({**CHAT, "request_id": "x" * 129}, None, "request_id"),
        ({**CHAT, "request_id": ""}, None, "request_id"),
        (CHAT, "y" * 129, "X-Request-Id"),
    ],
)
async def test_an_id_past_the_limit_is_named(
    server, body: dict[str, Any], header: str | None, param: str
) -> None:  # type: ignore[no-untyped-def]
    status, error = await _post(server, "/v1/chat/completions", body, header)
    assert status == 400 and error["error"]["param"] == param, error


async def test_answers_echo_the_request_id_when_asked(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(enable_request_id_headers=True))
    stream = {"prompt": "Hi", "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as http:
        headers = {"X-Request-Id": "trace-9"}
        async with http.post(f"{url}/v1/completions", json=stream, headers=headers) as resp:
            assert resp.status == 200 and resp.headers["X-Request-Id"] == "trace-9"
            await read_sse(resp)
        async with http.get(f"{url}/health") as resp:  # a fresh one where none was sent
            fresh = resp.headers["X-Request-Id"]
            assert resp.status == 200 and len(fresh) == 32 and int(fresh, 16) >= 0
        bad = {"prompt": "Hi", "max_tokens": -1}
        async with http.post(f"{url}/v1/completions", json=bad, headers=headers) as resp:
            assert resp.status == 400 and resp.headers["X-Request-Id"] == "trace-9"
        async with http.get(f"{server.url}/health", headers=headers) as resp:  # off by default
            assert resp.status == 200 and "X-Request-Id" not in resp.headers
