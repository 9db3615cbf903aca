"""`troupe bench serve --warm-connections`: a burst's connections are open before its clock
starts, so its requests are written at once (a scripted server counts the connections)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from troupe.ops.bench_serve import _run_http
from troupe.ops.bench_serve_args import build_parser
from troupe.ops.serve_client import HttpClient
from troupe.ops.serve_connections import ConnectionCount, connections_to_open, open_connections
from troupe.ops.serve_workload import BenchRequest, LengthSpec, make_requests


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aiohttp


class _Server:
    """/health, /v1/models and a streamed /v1/completions; notes each connection's first
    request and which connection carried each completion."""

    def __init__(self) -> None:
        self.first_use: dict[int, str] = {}  # connection -> the path of its first request
        self.completion_connections: list[int] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        return app

    @property
    def connections(self) -> set[int]:
        return set(self.first_use)

    def _seen(self, request: web.Request) -> int:
        key = id(request.transport)
        self.first_use.setdefault(key, request.path)
        return key

    async def health(self, request: web.Request) -> web.Response:
        self._seen(request)
        await asyncio.sleep(0.001)  # answered after the others were sent, as a busy server's
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.json_response({"data": [{"id": "scripted"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.completion_connections.append(self._seen(request))
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(body["max_tokens"]):
            chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
async def server() -> AsyncIterator[tuple[_Server, str]]:
    scripted = _Server()
    runner = web.AppRunner(scripted.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    yield scripted, f"http://{host}:{port}"
    await runner.cleanup()


@pytest.mark.anyio
async def test_opened_connections_carry_a_burst_without_new_ones(
    server: tuple[_Server, str],
) -> None:
    scripted, url = server
    count = ConnectionCount()
    async with aiohttp.ClientSession(trace_configs=[count.trace]) as session:
        assert await open_connections(session, url, 24, count) == count.opened >= 24
        assert len(scripted.connections) == count.opened
        opened = count.opened
        client = HttpClient(session, url, model="m", temperature=0.0, ignore_eos=True)
        reqs = [
            BenchRequest(index=i, prompt_ids=[1], output_len=2, arrival_s=0.0) for i in range(24)
        ]
        results = await asyncio.gather(*(client.send(r) for r in reqs))
        assert all(r.success for r in results)
        assert count.opened == opened  # the burst found its connections open
        assert len(set(scripted.completion_connections)) == 24  # and on 24 of them at once


@pytest.mark.anyio
async def test_without_opening_a_burst_opens_its_own(server: tuple[_Server, str]) -> None:
    """The check above can fail: a cold pool opens a connection per request of the burst."""
    scripted, url = server
    count = ConnectionCount()
    async with aiohttp.ClientSession(trace_configs=[count.trace]) as session:
        client = HttpClient(session, url, model="m", temperature=0.0, ignore_eos=True)
        reqs = [
            BenchRequest(index=i, prompt_ids=[1], output_len=2, arrival_s=0.0) for i in range(8)
        ]
        await asyncio.gather(*(client.send(r) for r in reqs))
    assert count.opened == len(scripted.connections) == 8


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--request-rate", "inf"], (16, True)),  # a burst: its size by default
        (["--request-rate", "inf", "--max-concurrency", "5"], (5, True)),
        (["--request-rate", "inf", "--warm-connections", "0"], (0, False)),  # vLLM's client
        (["--request-rate", "50"], (0, None)),  # spread arrivals: none by default
        (["--request-rate", "50", "--warm-connections", "7"], (7, None)),
        # a ramp spreads its arrivals too, although --request-rate stays at its inf default
        (
            [
                "--ramp-up-strategy",
                "linear",
                "--ramp-up-start-rps",
                "50",
                "--ramp-up-end-rps",
                "400",
            ],
            (0, None),
        ),
    ],
)
async def test_bench_run_opens_what_the_flag_says(
    server: tuple[_Server, str], flags: list[str], expected: tuple[int, bool | None]
) -> None:
    scripted, url = server
    args = build_parser().parse_args(
        ["--num-prompts", "16", "--input-len", "4", "--output-len", "2", "--no-progress", *flags]
    )
    want, burst_found_them_open = expected
    requests = make_requests(
        LengthSpec(input_len=4, output_len=2), 16, seed=0, request_rate=args.request_rate
    )
    results, _, model, _, _, opened = await _run_http(url, requests, args)
    assert model == "scripted" and all(r.success for r in results)
    assert (opened > 0) == (want > 0)
    # connections first used by one of the load's completions (the first is the warm-up's)
    load = scripted.completion_connections[1:]
    new_for_load = sum(scripted.first_use[c] == "/v1/completions" for c in set(load))
    if burst_found_them_open is not None:
        assert (new_for_load == 0) == burst_found_them_open, new_for_load


def test_default_opens_a_bursts_size_and_nothing_for_spread_arrivals() -> None:
    def n(flag: int | None, burst: bool, cap: int | None) -> int:
        return connections_to_open(flag, num_prompts=300, burst=burst, max_concurrency=cap)

    assert n(None, True, None) == 300
    assert n(None, True, 64) == 64
    assert n(None, False, None) == 0
    assert (n(0, True, None), n(12, False, None)) == (0, 12)


def test_send_phase_bench_reports_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    """ops/send_phase_bench.py: a stamping server in a child, a line per way of sending."""
    from troupe.ops.send_phase_bench import main

    assert main(["--num-prompts", "12", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("server saw the burst's 12 requests")
    assert [line.split()[0] for line in lines[1:]] == ["cold", "opened"]
    assert all("first" in line and "last" in line for line in lines[1:])


@pytest.mark.anyio
async def test_opening_against_nothing_opens_nothing() -> None:
    """Best effort: a server that is gone makes the pings fail quietly (the load reports it)."""
    count = ConnectionCount()
    async with aiohttp.ClientSession(trace_configs=[count.trace]) as session:
        assert await open_connections(session, "http://127.0.0.1:9", 4, count) == 0
