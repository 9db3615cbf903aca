"""How long a burst's requests take to reach the server, with and without opened connections.

    python -m troupe.ops.send_phase_bench --num-prompts 300 --repeats 3

A stamping server in a child process (aiohttp; each completion's handler notes CLOCK_MONOTONIC
and answers one SSE chunk at once, so no engine is in the way) and `troupe bench serve`'s own
client (serve_client.HttpClient through serve_load.run_load, issue 9's burst lengths) sending
the whole burst at once; per run, when the server's handler saw the requests, in ms after the
burst began. "cold" opens each request's connection inside the burst (vLLM's client,
`--warm-connections 0`); "opened" first fills the pool (serve_connections.open_connections, the
default for a burst). What a request's TTFT carries of the client's own sending is the gap.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

import aiohttp
from aiohttp import web
from troupe.ops.serve_client import HttpClient
from troupe.ops.serve_connections import ConnectionCount, open_connections
from troupe.ops.serve_load import run_load
from troupe.ops.serve_workload import LengthSpec, make_requests

_CHUNK = b'data: {"choices":[{"index":0,"text":"x"}]}\n\ndata: [DONE]\n\n'


def _serve(conn: Connection) -> None:
    """The child: serve until killed; the port goes back through `conn`."""
    arrivals: list[float] = []

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def completions(request: web.Request) -> web.StreamResponse:
        arrivals.append(time.monotonic())
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_CHUNK)
        return response

    async def taken(request: web.Request) -> web.Response:
        out = list(arrivals)
        arrivals.clear()
        return web.json_response(out)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/arrivals", taken)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        conn.send(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


async def burst(url: str, num_prompts: int, *, opened: bool, seed: int) -> list[float]:
    """Sorted ms after the burst's start at which the server saw each of its requests."""
    spec = LengthSpec(min_input_len=128, max_input_len=1024, output_len=1)
    requests = make_requests(spec, num_prompts, seed=seed)
    count = ConnectionCount()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[count.trace]) as session:
        client = HttpClient(session, url, model="m", temperature=0.0, ignore_eos=True)
        await client.send(requests[0])  # the warm-up request, as the benchmark sends
        if opened:
            await open_connections(session, url, num_prompts, count)
        async with session.get(f"{url}/arrivals") as resp:
            await resp.read()  # the warm-up's stamp out of the way
        start = time.monotonic()
        results, _ = await run_load(client, requests)
        async with session.get(f"{url}/arrivals") as resp:
            arrivals = [float(t) for t in await resp.json()]
    if not all(r.success for r in results):
        raise RuntimeError(next(r.error for r in results if not r.success))
    return sorted(1e3 * (t - start) for t in arrivals)


def summary(label: str, ms: Sequence[float]) -> str:
    def at(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    return (
        f"{label:7s} first {ms[0]:6.1f}  p10 {at(0.1):6.1f}  p50 {at(0.5):6.1f}  "
        f"p90 {at(0.9):6.1f}  last {ms[-1]:6.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m troupe.ops.send_phase_bench", description=__doc__)
    p.add_argument("--num-prompts", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(child,), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{parent.recv()}"
        print(f"server saw the burst's {args.num_prompts} requests at (ms after its start):")
        for repeat in range(args.repeats):
            for opened in (False, True):
                ms = asyncio.run(burst(url, args.num_prompts, opened=opened, seed=repeat))
                print(summary("opened" if opened else "cold", ms), flush=True)
    finally:
        server.kill()
        server.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
