"""`troupe bench serve`: vLLM's metric definitions on hand-made timings, the SSE client against
a scripted server, and CI-sized runs through a started `troupe serve --runner fake` and through
the engine in-process (its workload: test_serve_workload.py)."""

from __future__ import annotations

import asyncio
import io
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from troupe.ops.bench_serve import main
from troupe.ops.serve_client import HttpClient, SseRead
from troupe.ops.serve_load import Progress, run_load
from troupe.ops.serve_metrics import RequestResult, compute_metrics, metrics_json, parse_goodput
from troupe.ops.serve_workload import (
    BenchRequest,
    LengthSpec,
    make_requests,
)
from troupe.ops.server_ttft import parse_buckets, quantiles


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aiohttp


# -- metrics -----------------------------------------------------------------------------------


def _results() -> list[RequestResult]:
    return [
        # tpot (0.5 - 0.1) / 4 = 0.1 s
        RequestResult(True, 10, 5, ttft=0.1, latency=0.5, itl=[0.1, 0.1, 0.1, 0.1]),
        # one output token: no tpot sample, tpot 0 for goodput
        RequestResult(True, 20, 1, ttft=0.3, latency=0.3),
        # tpot (1.2 - 0.2) / 2 = 0.5 s
        RequestResult(True, 30, 3, ttft=0.2, latency=1.2, itl=[0.5, 0.5]),
        RequestResult(False, 40, 0, error="HTTP 429"),
    ]


def test_metrics_match_hand_computed_values() -> None:
    m = compute_metrics(_results(), 2.0, percentiles=(50, 90, 99))
    assert (m.completed, m.failed, m.total_input, m.total_output) == (3, 1, 60, 9)
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(4.5)
    assert m.total_token_throughput == pytest.approx(34.5)
    assert m.request_goodput is None
    ttft, tpot, itl, e2el = (m.latencies[k] for k in ("ttft", "tpot", "itl", "e2el"))
    # TTFT [100, 300, 200] ms; linear interpolation: p90 at rank 1.8 -> 200 + 0.8 * 100
    assert (ttft.mean, ttft.median) == pytest.approx((200.0, 200.0))
    assert ttft.percentiles == pytest.approx({50: 200.0, 90: 280.0, 99: 298.0})
    assert ttft.std == pytest.approx(math.sqrt(20000 / 3))
    # TPOT [100, 500] ms (the one-token request has none)
    assert (tpot.mean, tpot.percentiles[90], tpot.percentiles[99]) == pytest.approx(
        (300.0, 460.0, 496.0)
    )
    # ITL: every gap of every request, [100 x4, 500 x2] ms
    assert (itl.mean, itl.median, itl.percentiles[90]) == pytest.approx((1400 / 6, 100.0, 500.0))
    # E2E [500, 300, 1200] ms: p90 at rank 1.8 -> 500 + 0.8 * 700
    assert (e2el.mean, e2el.median, e2el.percentiles[90]) == pytest.approx(
        (2000 / 3, 500.0, 1060.0)
    )


@pytest.mark.parametrize(
    ("slo", "num_good"),
    [
        ({"ttft": 250, "tpot": 200}, 1),  # the second is too slow to start, the third per token
        ({"tpot": 0}, 1),  # only the one-token request: its tpot counts as 0, as in vLLM
        ({"e2el": 500}, 2),  # the bound itself is good
        ({"ttft": 1000, "tpot": 1000, "e2el": 1000}, 2),
    ],
)
def test_goodput_counts_requests_within_every_slo(slo: dict[str, float], num_good: int) -> None:
    m = compute_metrics(_results(), 2.0, goodput=slo)
    assert m.request_goodput == pytest.approx(num_good / 2.0)


def test_no_result_reads_zero_and_json_uses_vllm_keys() -> None:
    m = compute_metrics([], 0.0, percentiles=(99, 99.9))
    assert (m.completed, m.request_throughput, m.latencies["ttft"].mean) == (0, 0.0, 0.0)
    keys = metrics_json(compute_metrics(_results(), 2.0, percentiles=(99, 99.9)))
    assert keys["p99_ttft_ms"] == pytest.approx(298.0)
    assert {"p99.9_itl_ms", "median_e2el_ms", "std_tpot_ms", "request_goodput"} <= set(keys)


def test_goodput_flag_parses_like_vllms() -> None:
    assert parse_goodput(["ttft:200", "tpot:20"]) == {"ttft": 200.0, "tpot": 20.0}
    for bad in ("itl:5", "ttft", "ttft:fast", "e2el:-1"):
        with pytest.raises(ValueError, match="goodput"):
            parse_goodput([bad])


# -- load driver and progress ------------------------------------------------------------------


class _CountingClient:
    def __init__(self) -> None:
        self.in_flight = self.max_in_flight = 0

    async def send(self, req: BenchRequest) -> RequestResult:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        for _ in range(3):  # let every other ready task run before this one ends
            await asyncio.sleep(0)
        self.in_flight -= 1
        return RequestResult(True, req.input_len, req.output_len, error=str(req.index))


@pytest.mark.anyio
async def test_max_concurrency_bounds_requests_in_flight() -> None:
    requests = make_requests(LengthSpec(input_len=4, output_len=2), 12, seed=0)
    client = _CountingClient()
    stream = io.StringIO()
    results, seconds = await run_load(
        client, requests, max_concurrency=3, progress=Progress(12, stream)
    )
    assert client.max_in_flight == 3
    assert [r.error for r in results] == [str(i) for i in range(12)]  # in request order
    lines = stream.getvalue().splitlines()  # not a terminal: a line per tenth
    assert len(lines) == 10 and "12/12 requests" in lines[-1] and seconds >= 0


# -- the SSE client, against a scripted server ------------------------------------------------


def _sse_app(
    chunks: list[bytes], seen: list[dict[str, object]], status: int = 200
) -> web.Application:

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        if status != 200:
            return web.json_response({"error": {"message": "busy"}}, status=status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


@pytest.fixture
async def serve_app() -> AsyncIterator[object]:
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def _data(obj: object) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


TEXT = {"choices": [{"index": 0, "text": "x", "finish_reason": None}], "usage": None}
USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("chunks", "status", "expected"),
    [
        # 3 content chunks -> 2 ITL gaps; tokens and prompt length from the usage chunk
        ([_data(TEXT), b": ping\n\n", _data(TEXT), _data(TEXT), _data(USAGE), b"data: [DONE]\n\n"],
         200, (True, 7, 3, 2, "")),
        # no usage: content chunks stand in for tokens
        ([_data(TEXT), _data(TEXT), b"data: [DONE]\n\n"], 200, (True, 2, 5, 1, "")),
        ([_data(TEXT), _data({"error": {"message": "engine failed"}})], 200,
         (False, 0, 5, 0, "engine failed")),
        ([b"data: [DONE]\n\n"], 200, (False, 0, 5, 0, "no content chunk")),
        ([], 429, (False, 0, 5, 0, "HTTP 429")),
    ],
)  # fmt: skip
@pytest.mark.parametrize("sse_read", ["events", "lines"])
async def test_http_client_times_content_chunks(
    serve_app: object,
    chunks: list[bytes],
    status: int,
    expected: tuple[object, ...],
    sse_read: SseRead,
) -> None:
    import aiohttp

    seen: list[dict[str, object]] = []
    url = await serve_app(_sse_app(chunks, seen, status))  # type: ignore[operator]
    req = BenchRequest(index=0, prompt_ids=[5, 6, 7, 8, 9], output_len=7, arrival_s=0.0)
    async with aiohttp.ClientSession() as session:
        client = HttpClient(
            session, url, model="m", temperature=0.6, ignore_eos=True, sse_read=sse_read
        )
        r = await client.send(req)
    success, num_tokens, prompt_len, num_gaps, error = expected
    assert (r.success, r.output_tokens, r.prompt_len, len(r.itl)) == (
        success,
        num_tokens,
        prompt_len,
        num_gaps,
    )
    assert str(error) in r.error
    if success:
        assert 0 < r.ttft <= r.latency
    assert seen[0] == {
        "prompt": [5, 6, 7, 8, 9],
        "max_tokens": 7,
        "temperature": 0.6,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "model": "m",
    }


@pytest.mark.anyio
@pytest.mark.parametrize(
    "writes",
    [
        [_data(TEXT) + _data(TEXT) + _data(TEXT) + _data(USAGE)],  # four events, one write
        [_data(TEXT)[:9], _data(TEXT)[9:] + _data(TEXT)[:3], _data(TEXT)[3:] + _data(TEXT)],
        [_data(TEXT) * 2 + _data(TEXT).rstrip(b"\n")],  # the body ends without a blank line
    ],
    ids=["coalesced", "split", "no-final-blank"],
)
async def test_events_are_cut_from_socket_reads_whatever_the_writes(
    serve_app: object, writes: list[bytes]
) -> None:
    """--sse-read events (vLLM's client): events come out whole and in order however the
    server's writes (and so the socket reads) cut them."""
    import aiohttp

    url = await serve_app(_sse_app(writes, []))  # type: ignore[operator]
    req = BenchRequest(index=0, prompt_ids=[1], output_len=3, arrival_s=0.0)
    async with aiohttp.ClientSession() as session:
        client = HttpClient(session, url, model="m", temperature=0.0, ignore_eos=True)
        r = await client.send(req)
    assert r.success, r.error
    assert len(r.itl) == 2  # three content chunks
    assert r.output_tokens == (7 if b"completion_tokens" in b"".join(writes) else 3)


# -- end to end --------------------------------------------------------------------------------

FLAGS = ["--num-prompts", "40", "--input-len", "32", "--output-len", "8", "--range-ratio", "0.5"]
FLAGS += ["--seed", "7", "--goodput", "ttft:60000", "--no-progress"]


@pytest.mark.parametrize(
    "mode",
    [
        # starts `troupe serve --runner fake`; polls the live view's endpoint as the page does
        ["--request-rate", "400", "--runner", "fake", "--poll-engine-stats", "0.05"],
        ["--engine", "--max-concurrency", "6", "--runner", "fake", "--device", "cpu"],
    ],
    ids=["http", "engine"],
)
def test_ci_sized_run_completes_every_request(
    mode: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result_file = tmp_path / "result.json"
    status = main([*FLAGS, *mode, "--result-file", str(result_file)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "Successful requests:" in out and "TPOT" in out
    result = json.loads(result_file.read_text())
    planned = make_requests(
        LengthSpec(input_len=32, output_len=8, range_ratio=0.5), 40, seed=7, request_rate=400.0
    )
    assert (result["completed"], result["failed"]) == (40, 0)
    assert result["errors"] == [""] * 40
    # ignore_eos: every request generates exactly what it asked for, counted by the server
    assert result["output_lens"] == [r.output_len for r in planned]
    assert result["input_lens"] == [r.input_len for r in planned]
    assert result["total_output_tokens"] == sum(r.output_len for r in planned)
    assert result["mode"] == ("engine" if "--engine" in mode else "http")
    # the first poll is awaited before the load: an HTTP run reports at least one
    assert (result["engine_stats_polls"] >= 1) == ("--engine" not in mode)
    cpu = result["server_cpu"]  # a started server's processes, read from /proc
    if "--engine" in mode:
        assert cpu is None
    else:  # `troupe serve` runs its engine in a child by default
        assert cpu["gateway_s"] >= 0 and cpu["engine_s"] is not None and cpu["engine_s"] >= 0
        assert "Gateway CPU (s) / per output token (us)" in out
    assert result["request_goodput"] is not None and len(result["ttfts"]) == 40
    # the peaks (vLLM's keys): --max-concurrency 6 bounds the engine run's
    assert 1 <= result["max_concurrent_requests"] <= (6 if "--engine" in mode else 40)
    server_ttft = result["server_ttft_ms"]  # the server's own histogram (ops/server_ttft.py)
    if "--engine" in mode:
        assert server_ttft is None
    else:
        assert set(server_ttft) == {"p50", "p90", "p99"}
        assert 0 < server_ttft["p50"] <= server_ttft["p90"] <= server_ttft["p99"]
        assert "Server TTFT p50 / p90 / p99 (ms)" in out
    assert all(len(itl) >= 1 for itl in result["itls"])  # 8 +- 4 tokens: more than one chunk


@pytest.mark.parametrize(
    "mode",
    [
        ["--request-rate", "400", "--runner", "fake"],
        ["--engine", "--runner", "fake", "--device", "cpu"],
    ],
    ids=["http", "engine"],
)
def test_structured_requests_ask_for_json_and_say_whether_it_parses(
    mode: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result_file = tmp_path / "result.json"
    argv = ["--num-prompts", "12", "--input-len", "16", "--output-len", "200", "--seed", "5",
            "--structured-output-ratio", "0.5", "--no-progress", "--result-file", str(result_file)]  # fmt: skip
    status = main([*argv, *mode])
    out = capsys.readouterr().out
    assert status == 0, out
    result = json.loads(result_file.read_text())
    planned = make_requests(LengthSpec(input_len=16, output_len=200), 12, seed=5,
                            request_rate=400.0, structured_ratio=0.5)  # fmt: skip
    structured = [r.schema is not None for r in planned]
    assert [v is not None for v in result["json_valid"]] == structured
    for r, valid, n in zip(planned, result["json_valid"], result["output_lens"], strict=True):
        if r.schema is None:
            assert n == r.output_len  # ignore_eos: the plain ones run to their length
        else:  # its grammar ends it: the JSON parses unless max_tokens cut it
            assert valid or n == r.output_len, (valid, n)
    valid = sum(v is True for v in result["json_valid"])
    assert valid >= 1 and result["structured"] == {"requests": 6, "valid_json": valid}
    assert "Structured requests / valid JSON:" in out


def test_flag_errors_exit_2() -> None:
    for argv in (
        ["--engine", "--base-url", "http://127.0.0.1:1"],
        ["--goodput", "itl:5"],
        ["--base-url", "http://127.0.0.1:1", "--max-num-seqs", "4"],
        ["--range-ratio", "1.5"],
        ["--structured-output-ratio", "1.5"],
        ["--poll-engine-stats", "0"],
        ["--engine", "--poll-engine-stats", "1"],
        ["--server-pid", "1"],  # only with --base-url
        ["--warm-connections", "-1"],
        ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"],  # no end rate
        ["--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4"],  # no strategy
        ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "4",
         "--request-rate", "8"],  # the ramp sets the rates
        ["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "4"],
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv


def test_server_ttft_quantiles_from_two_readings() -> None:
    """The run's own observations (after - before), interpolated within buckets as Prometheus's
    histogram_quantile does; past the last finite bound, that bound; nothing new: None."""
    page = "\n".join(
        [
            "# TYPE troupe_time_to_first_token_seconds histogram",
            'troupe_time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 12.0',
            'troupe_time_to_first_token_seconds_bucket{model_name="m",le="0.2"} 16.0',
            'troupe_time_to_first_token_seconds_bucket{le="0.4"} 20.0',  # another server's
            'troupe_time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 22.0',
            'troupe_time_to_first_token_seconds_count{model_name="m"} 22.0',
        ]
    )
    after = parse_buckets(page)
    assert after == {0.1: 12.0, 0.2: 16.0, 0.4: 20.0, math.inf: 22.0}
    before = {0.1: 2.0, 0.2: 2.0, 0.4: 2.0, math.inf: 2.0}  # 20 new: 10 / 4 / 4 / 2
    got = quantiles(before, after, [50.0, 60.0, 90.0, 99.0])
    assert got is not None
    assert got["p50"] == pytest.approx(100.0)  # rank 10: the first bucket's bound
    assert got["p60"] == pytest.approx(150.0)  # rank 12: half way into (0.1, 0.2]
    assert got["p90"] == pytest.approx(400.0)  # rank 18: the end of (0.2, 0.4]
    assert got["p99"] == pytest.approx(400.0)  # rank 19.8: +Inf's bucket reads 0.4
    assert quantiles(after, after, [50.0]) is None
    assert quantiles(None, after, [50.0]) is None
    assert parse_buckets("other_metric 1.0") is None
