"""200 concurrent SSE streams, a third dropped mid-stream: all end, no KV block leaks."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.anyio

NUM_REQUESTS = 200


async def _outcomes(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return {
        s.labels["outcome"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "troupe_requests"
        for s in family.samples
        if s.name == "troupe_requests_total"
    }


async def test_200_streams_with_a_third_dropped(server) -> None:  # type: ignore[no-untyped-def]
    url = f"{server.url}/v1/completions"
    connector = aiohttp.TCPConnector(limit=0)  # no client-side cap: all 200 at once

    async def one(http: aiohttp.ClientSession, i: int) -> str:
        dropped = i % 3 == 0
        body = {
            "prompt": f"request {i}",
            "max_tokens": 400 if dropped else 12,
            "ignore_eos": True,
            "stream": True,
        }
        async with http.post(url, json=body) as resp:
            assert resp.status == 200, await resp.text()
            last = ""
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line:
                    continue
                last = line
                if dropped:
                    return "dropped"  # leave mid-stream: the connection is closed under it
            assert last == "data: [DONE]"
            return "done"

    async with aiohttp.ClientSession(connector=connector) as http:
        before = await _outcomes(http, server.url)
        results = await asyncio.gather(*(one(http, i) for i in range(NUM_REQUESTS)))
        num_dropped = sum(1 for i in range(NUM_REQUESTS) if i % 3 == 0)
        assert results.count("dropped") == num_dropped
        assert results.count("done") == NUM_REQUESTS - num_dropped
        await asyncio.to_thread(server.wait_idle, 20.0)
        after = await _outcomes(http, server.url)
    # Every request reached one terminal event in the engine: finished, or aborted when dropped
    # (an engine in its own process may finish a dropped one before the gateway sees it go).
    num_aborted = after["aborted"] - before["aborted"]
    assert after["length"] - before["length"] == NUM_REQUESTS - num_aborted
    assert num_aborted <= num_dropped
    assert server.engine.stats().num_gpu_blocks_used == 0
    assert json.dumps(after)  # the outcomes are plain numbers
