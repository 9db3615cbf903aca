"""Open the benchmark's connections before its clock starts.

A burst of N requests from one asyncio client opens N new connections, and aiohttp spends
~0.2 ms of the client's loop on each request before its connection is even attempted: on the
H200's host the 300-request burst's first new connection sent at ~80 ms and the gateway took the
last request in at ~150 ms (docs/benchmarks.md, session 28), so every request's TTFT carried up
to 100 ms of the benchmark's own sending. Real clients of a burst are many machines, or one
client with a pool of kept-alive connections; neither pays that serially.

`open_connections` fills the session's pool with `n` kept-alive connections (concurrent
`GET /health`s, each answered on a connection of its own, repeated until the pool holds `n`), so
the load's requests find one idle and are written at once. `--warm-connections 0` keeps vLLM's
behaviour: connections opened inside the timed requests.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aiohttp


class ConnectionCount:
    """Counts the connections a session opens (give `trace` to the ClientSession)."""

    def __init__(self) -> None:
        self.opened = 0
        self.trace = aiohttp.TraceConfig()
        self.trace.on_connection_create_end.append(self._opened)

    async def _opened(
        self, session: aiohttp.ClientSession, context: SimpleNamespace, params: object
    ) -> None:
        self.opened += 1


async def open_connections(
    session: aiohttp.ClientSession,
    base_url: str,
    n: int,
    count: ConnectionCount,
    *,
    rounds: int = 4,
) -> int:
    """Open connections until `n` requests sent at once find one idle each (a round of `n`
    opens none), at most `rounds` rounds; returns how many were opened (the pool's earlier
    connections count toward `n`). In a round, requests that find an idle connection take
    it and the rest open one."""
    url = base_url.rstrip("/") + "/health"
    start = count.opened
    for _ in range(rounds):
        before = count.opened
        await asyncio.gather(*(_ping(session, url) for _ in range(n)))
        if count.opened == before:
            break
    return count.opened - start


async def _ping(session: aiohttp.ClientSession, url: str) -> None:
    """Best effort: a connection that fails is one fewer opened, and the load finds out."""
    try:
        async with session.get(url) as resp:
            await resp.read()  # any answer keeps the connection; the body read frees it
    except (aiohttp.ClientError, TimeoutError):
        pass


def connections_to_open(
    flag: int | None, *, num_prompts: int, burst: bool, max_concurrency: int | None
) -> int:
    """--warm-connections: as given, or by default as many requests as the load sends at once
    at its start (a burst: every request, up to --max-concurrency), else none (arrivals spread
    over time open their connections one at a time, as a server's clients do)."""
    if flag is not None:
        return flag
    if not burst:
        return 0
    return min(num_prompts, max_concurrency or num_prompts)
