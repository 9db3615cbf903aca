"""`troupe bench soak`: a CI-sized run passes against the real server; the checks fail on a
leak (blocks held, a request running), on a lost or doubled ending, and on process growth."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import WSMsgType, web
from troupe.ops.bench_soak import main, run_soak
from troupe.ops.soak_checks import (
    Outcome,
    ProcessSample,
    check_metrics,
    check_outcomes,
    check_process,
    parse_metrics,
)

IDLE_PAGE = """\
# HELP troupe_kv_blocks_used KV cache blocks owned by requests
# TYPE troupe_kv_blocks_used gauge
troupe_kv_blocks_used{model_name="m",pool="gpu"} 0.0
troupe_kv_blocks_used{model_name="m",pool="cpu"} 0.0
troupe_requests_running{model_name="m"} 0.0
troupe_requests_waiting{model_name="m"} 0.0
troupe_requests_swapped{model_name="m"} 0.0
troupe_requests_total{model_name="m",outcome="length"} 12.0
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aiohttp


def test_idle_metrics_pass_and_a_held_block_fails() -> None:
    key = ("troupe_requests_total", (("model_name", "m"), ("outcome", "length")))
    assert parse_metrics(IDLE_PAGE)[key] == 12
    assert all(check.is_ok for check in check_metrics(IDLE_PAGE))
    leaking = IDLE_PAGE.replace('pool="gpu"} 0.0', 'pool="gpu"} 3.0')
    leaking = leaking.replace('running{model_name="m"} 0.0', 'running{model_name="m"} 1.0')
    failed = {check.name: check.value for check in check_metrics(leaking) if not check.is_ok}
    assert failed == {
        'troupe_kv_blocks_used{pool="gpu"} == 0': "3",
        "troupe_requests_running == 0": "1",
    }
    missing = check_metrics(IDLE_PAGE.replace('troupe_requests_swapped{model_name="m"} 0.0\n', ""))
    assert [(c.name, c.value) for c in missing if not c.is_ok] == [
        ("troupe_requests_swapped == 0", "missing")
    ]


def test_lost_doubled_and_faulted_requests_fail() -> None:
    good = [
        Outcome("ws", "finished", 1, 0.1, "length"),
        Outcome("http_cut", "cut", 0, 0.1),
        Outcome("invalid", "error", 1, 0.1, "invalid_value"),
    ]
    assert all(check.is_ok for check in check_outcomes(good, 3))
    bad = [
        *good,
        Outcome("chat_stream", "lost", 0, 0.1, "0 terminal chunks, 0 [DONE]"),
        Outcome("ws", "finished", 2, 0.1, "terminal frames after the first"),
        Outcome("chat", "error", 1, 0.1, "internal_error"),
    ]
    failed = [check.name for check in check_outcomes(bad, 6) if not check.is_ok]
    assert failed == [
        "no request lost (0 terminal events)",
        "no request with 2+ terminal events",
        "no server fault (internal_error, failed)",
    ]
    assert not check_outcomes(good, 4)[0].is_ok  # one request never came back at all


def test_process_growth_over_the_limit_fails() -> None:
    before = ProcessSample(rss_bytes=100 * 2**20, num_fds=10)
    fine = check_process(
        before, ProcessSample(130 * 2**20, 12), max_rss_growth_mb=64, max_fd_growth=8
    )
    assert all(check.is_ok for check in fine)
    grown = check_process(
        before, ProcessSample(200 * 2**20, 40), max_rss_growth_mb=64, max_fd_growth=8
    )
    assert [check.value for check in grown if not check.is_ok] == [
        "100 -> 200 MB (+100.0)",
        "10 -> 40 (+30)",
    ]


@dataclass
class Faults:
    held_blocks: int = 0  # what /metrics reports as still in use
    drop_done: bool = False  # SSE streams end without [DONE]
    double_done: bool = False  # websocket requests get two `done` frames


def _fake_server(faults: Faults) -> web.Application:
    """Just enough of the gateway's protocol for the workload, with faults on demand."""

    async def metrics(request: web.Request) -> web.Response:
        page = IDLE_PAGE.replace('pool="gpu"} 0.0', f'pool="gpu"}} {faults.held_blocks}.0')
        return web.Response(text=page)

    async def completion(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["max_tokens"] < 1 or len(json.dumps(body)) > 100_000:
            return web.json_response({"error": {"code": "invalid_value"}}, status=400)
        done = {"choices": [{"text": "x", "finish_reason": "length"}]}
        if not body.get("stream"):
            return web.json_response(done)
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(3):
            await response.write(b'data: {"choices": [{"text": "x", "finish_reason": null}]}\n\n')
        await response.write(f"data: {json.dumps(done)}\n\n".encode())
        if not faults.drop_done:
            await response.write(b"data: [DONE]\n\n")
        return response

    async def websocket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            frame = json.loads(msg.data)
            request_id = frame["request_id"]
            if frame["type"] == "cancel":
                continue  # the fake finishes at once: the cancel always loses the race
            for _ in range(3):
                await ws.send_json({"type": "delta", "request_id": request_id, "text": "x"})
            done = {"type": "done", "request_id": request_id, "finish_reason": "length"}
            for _ in range(2 if faults.double_done else 1):
                await ws.send_json(done)
        return ws

    app = web.Application(client_max_size=2**24)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completion)
    app.router.add_post("/v1/chat/completions", completion)
    app.router.add_get("/v1/ws", websocket)
    return app


@pytest.fixture
async def fake_server() -> AsyncIterator[tuple[str, Faults]]:
    faults = Faults()
    runner = web.AppRunner(_fake_server(faults))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}", faults
    await runner.cleanup()


@pytest.mark.anyio
async def test_soak_catches_injected_faults(fake_server: tuple[str, Faults]) -> None:
    url, faults = fake_server
    clean = await run_soak(url, num_requests=60, concurrency=8, settle_seconds=0)
    assert clean.is_ok, [c for c in clean.checks if not c.is_ok]

    faults.held_blocks, faults.drop_done, faults.double_done = 2, True, True
    leaky = await run_soak(url, num_requests=60, concurrency=8, settle_seconds=0)
    failed = {check.name for check in leaky.checks if not check.is_ok}
    assert failed == {
        'troupe_kv_blocks_used{pool="gpu"} == 0',
        "no request lost (0 terminal events)",  # SSE without [DONE]
        "no request with 2+ terminal events",  # the second websocket `done`
    }
    assert not leaky.is_ok


def test_ci_sized_soak_against_the_real_server(capsys: pytest.CaptureFixture[str]) -> None:
    # Starts `troupe serve --runner fake`, 200 mixed requests, then every check, RSS and FDs
    # of the server process included, and a clean exit on SIGTERM.
    status = main(["--requests", "200", "--concurrency", "16"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.rstrip().endswith("PASS")
    assert "server open FDs growth <= 8" in out and "server exits 0 on SIGTERM" in out
