"""GET /v1/engine/stats: one JSON snapshot for the page's live engine view (about 1/s).

It reads what is already measured, nothing more: `engine.stats()` (the scheduler's last
snapshot: pools, queues, preemptions, prefix cache), `engine.graph_stats()` (the actor shells'
message counts and inbox depths, asked on demand, one socket round trip when the engine runs
in a child process), and the gateway's latency histograms over the last minute
(gateway/latency_window.py). Under /v1/, so it takes the API key like the API: its counts tell
about other clients' traffic (the prefix-cache hit rate included).
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from aiohttp import web
from troupe.gateway.errors import ApiError
from troupe.gateway.latency_window import LatencyWindow, Percentiles
from troupe.gateway.metrics import GatewayMetrics
from troupe.gateway.state import GATEWAY
from troupe.messages import EngineStats
from troupe.messages.graph_stats import GraphStats

_QUERY_SECONDS = 5.0  # for the engine to answer; a stuck one gets a 503, the page retries
_encoder = msgspec.json.Encoder()


class Latency(msgspec.Struct, frozen=True, kw_only=True):
    window_s: float  # seconds the percentiles cover (about 60 while the view is open)
    ttft: Percentiles
    itl: Percentiles


class EngineView(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    max_model_len: int
    num_streams: int  # engine streams this gateway holds open
    engine: EngineStats
    graph: GraphStats  # graph.time: when its counts were taken (rates: two snapshots)
    latency: Latency


class LatencyWindows:
    """The TTFT and ITL windows of one app, from its start."""

    def __init__(self, metrics: GatewayMetrics, now: float) -> None:
        self.ttft = LatencyWindow(metrics.ttft, now=now)
        self.itl = LatencyWindow(metrics.itl, now=now)

    def read(self, now: float) -> Latency:
        ttft, window_s = self.ttft.read(now)
        itl, _ = self.itl.read(now)
        return Latency(window_s=window_s, ttft=ttft, itl=itl)


WINDOWS = web.AppKey("latency_windows", LatencyWindows)


def add_engine_view(app: web.Application) -> None:
    """The route, and the latency windows it reads (based at the app's start)."""
    app[WINDOWS] = LatencyWindows(app[GATEWAY].metrics, time.monotonic())
    app.router.add_get("/v1/engine/stats", engine_stats)


async def engine_stats(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    engine = gateway.engine
    try:
        async with asyncio.timeout(_QUERY_SECONDS):
            graph = await engine.graph_stats()
    except TimeoutError:
        raise ApiError(503, "the engine did not answer in time", code="engine_busy") from None
    now = time.monotonic()
    view = EngineView(
        model=gateway.served_models().model_id,
        max_model_len=engine.max_model_len,
        num_streams=gateway.num_streams,
        engine=engine.stats(),
        graph=graph,
        latency=request.app[WINDOWS].read(now),
    )
    return web.Response(
        body=_encoder.encode(view),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )
