"""aiohttp's client: raw SSE, health, and every error status in OpenAI's error shape."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner

from tests.gateway.conftest import BASE_CONFIG

pytestmark = pytest.mark.anyio


async def read_sse(resp: aiohttp.ClientResponse) -> list[str]:
    """The `data:` payloads of an SSE response, in order."""
    payloads = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            payloads.append(line[6:])
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return payloads


def _error(body: dict[str, Any]) -> dict[str, Any]:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]  # type: ignore[no-any-return]


async def test_sse_stream_ends_with_done(server) -> None:  # type: ignore[no-untyped-def]
    body = {
        "prompt": "Hello",
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            payloads = await read_sse(resp)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 5 and chunks[-1]["choices"] == []
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "text_completion" for c in chunks)


async def test_health(server) -> None:  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/health") as resp:
            assert resp.status == 200
            body = await resp.json()
            assert body == {"status": "ok", "model": server.engine.model_name,
                            "home_id": server.gateway.home_id}  # fmt: skip
            assert len(body["home_id"]) == 12  # what its stored responses' ids carry


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"prompt": "x", "temperature": "hot"}, "temperature", "invalid_value"),
        ({"prompt": "x", "n": 0}, "n", "invalid_value"),
        ({"prompt": "x", "n": 1000}, "n", "invalid_value"),  # over max_num_samples
        ({"prompt": "x", "stop_token_ids": [10**9]}, "stop_token_ids", "invalid_value"),
        ({"prompt": list(range(1, 9000))}, "prompt", "context_length_exceeded"),
        # named, max_tokens must fit beside the prompt (vLLM's 400); a default is clipped
        (
            {"prompt": list(range(1, 100)), "max_tokens": 8100},
            "max_tokens",
            "context_length_exceeded",
        ),
    ],
)
async def test_400_names_the_field(server, body: dict[str, Any], param: str, code: str) -> None:  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as http:
        for stream in (False, True):
            async with http.post(
                f"{server.url}/v1/completions", json={**body, "stream": stream}
            ) as resp:
                assert resp.status == 400
                error = _error(await resp.json())
                assert (error["param"], error["code"]) == (param, code)
                assert error["type"] == "invalid_request_error"


async def test_chat_names_max_completion_tokens_when_it_does_not_fit(server) -> None:  # type: ignore[no-untyped-def]
    body = {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 8192}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 400
            error = _error(await resp.json())
    assert (error["param"], error["code"]) == ("max_completion_tokens", "context_length_exceeded")
    assert "max_model_len = 8192" in error["message"]


async def test_400_bad_json(server) -> None:  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as http:
        headers = {"Content-Type": "application/json"}
        url = f"{server.url}/v1/chat/completions"
        async with http.post(url, data=b"{nope", headers=headers) as resp:
            assert resp.status == 400
            assert _error(await resp.json())["param"] == "body"


async def test_404_unknown_model_and_route(server) -> None:  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as http:
        body = {"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 404
            error = _error(await resp.json())
            assert (error["param"], error["code"]) == ("model", "model_not_found")
            assert "gpt-17" in error["message"]
        async with http.get(f"{server.url}/v1/nothing-here") as resp:
            assert resp.status == 404
            _error(await resp.json())


async def test_401_when_a_key_is_set(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(api_key="s3cret"))
    body = {"prompt": "x", "max_tokens": 2}
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            async with http.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
                assert resp.status == 401
                assert _error(await resp.json())["type"] == "authentication_error"
        async with http.get(f"{url}/v1/ws") as resp:
            assert resp.status == 401
        headers = {"Authorization": "Bearer s3cret"}
        async with http.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
            assert (await resp.json())["usage"]["completion_tokens"] <= 2
        async with http.get(f"{url}/health") as resp:
            assert resp.status == 200  # probes need no key
        async with http.ws_connect(f"{url}/v1/ws?api_key=s3cret") as ws:
            await ws.close()


async def test_413_body_too_large(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(max_body_bytes=1000))
    async with aiohttp.ClientSession() as http:
        body = {"prompt": "x" * 2000, "max_tokens": 2}
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 413
            error = _error(await resp.json())
            assert error["code"] == "request_too_large" and "1000" in error["message"]


async def test_vanished_client_aborts_its_request(make_server) -> None:  # type: ignore[no-untyped-def]
    """A non-streaming client that hangs up: the handler is cancelled and the engine aborts.
    The runner holds the request's third step, so it cannot finish before the hang-up, however
    fast or slow this machine is."""
    import asyncio

    runner = FaultyRunner(FakeRunner.from_config(BASE_CONFIG))
    server = make_server(BASE_CONFIG, runner=runner)
    runner.hold_after(2)
    async with aiohttp.ClientSession() as http:
        before = await _aborted(http, server.url)
        body = {"prompt": "a long answer", "max_tokens": 1000, "ignore_eos": True}
        task = asyncio.create_task(http.post(f"{server.url}/v1/completions", json=body))
        assert await asyncio.to_thread(runner.wait_until_held, 120)  # a hang guard only
        task.cancel()  # closes the connection mid-request
        await asyncio.gather(task, return_exceptions=True)
        # The abort's terminal event does not wait for the held step.
        async with asyncio.timeout(120):  # a hang guard only
            while await _aborted(http, server.url) != before + 1:
                await asyncio.sleep(0.01)
        runner.release()
        await asyncio.to_thread(server.wait_idle)
        assert await _aborted(http, server.url) == before + 1


async def _aborted(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(f"{url}/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("troupe_requests_total{") and 'outcome="aborted"' in line:
                return float(line.split()[-1])
    raise AssertionError("no aborted counter in /metrics")
