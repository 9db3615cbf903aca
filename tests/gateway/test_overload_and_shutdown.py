"""429 when the engine's queue is full; 503 and a clean drain after a shutdown signal."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

pytestmark = pytest.mark.anyio

LONG = {"prompt": "tell me everything", "max_tokens": 1000, "ignore_eos": True, "stream": True}


async def _wait_for(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_429_with_retry_after(tight_server) -> None:  # type: ignore[no-untyped-def]
    url = f"{tight_server.url}/v1/completions"
    async with aiohttp.ClientSession() as http:

        async def hold() -> None:
            async with http.post(url, json=LONG) as resp:
                async for _ in resp.content:
                    pass

        holders = [asyncio.create_task(hold()) for _ in range(2)]
        engine = tight_server.engine
        await _wait_for(lambda: (engine.stats().num_running, engine.stats().num_waiting) == (1, 1))
        async with http.post(url, json={"prompt": "one more", "max_tokens": 2}) as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "1"
            error = (await resp.json())["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "overloaded")
            assert "max_num_seqs + max_queued_requests = 2" in error["message"]
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    await asyncio.to_thread(tight_server.wait_idle)


async def test_shutdown_drains_then_aborts(tight_server) -> None:  # type: ignore[no-untyped-def]
    base = tight_server.url
    runner = tight_server.runner
    # Two steps run (the first tokens stream), then the third waits until the test releases
    # it: the stream outlives the drain grace however fast this machine is.
    runner.hold_after(2)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/completions", json=LONG) as resp:
            assert resp.status == 200
            lines = [(await resp.content.readline()).decode().strip()]
            assert await asyncio.to_thread(runner.wait_until_held, 120)
            tight_server.begin_shutdown()
            async with asyncio.timeout(120):  # a hang guard only
                while True:  # /health turns 503 as soon as the server starts draining
                    async with http.get(f"{base}/health") as health:
                        if health.status == 503:
                            assert (await health.json())["status"] == "draining"
                            break
                    await asyncio.sleep(0.01)
            async with http.post(f"{base}/v1/completions", json={"prompt": "late"}) as late:
                assert late.status == 503
                error = (await late.json())["error"]
                assert (error["type"], error["code"]) == ("service_unavailable", "shutting_down")
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect(f"{base}/v1/ws")
            assert info.value.status == 503
            # The in-flight stream gets its grace period, then a terminal error and [DONE].
            async for raw in resp.content:
                if raw.strip():
                    lines.append(raw.decode().strip())
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: ") :])
    assert last["error"]["code"] == "aborted" and "shutting down" in last["error"]["message"]
    assert runner.num_held == 1  # the stream was cut while its step was held, not after it ended
    runner.release()  # the engine's close waits for the held step to finish
    await asyncio.to_thread(tight_server.join, 30.0)  # serve() returned without an error
