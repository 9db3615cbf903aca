"""Serving benchmark: latency and throughput of streamed requests, as `vllm bench serve` measures.

    troupe bench serve --num-prompts 200 --request-rate 8          # starts `troupe serve`
    troupe bench serve --model PATH --device cuda --request-rate 24 --goodput ttft:200 tpot:20
    troupe bench serve --base-url http://127.0.0.1:8000 --max-concurrency 64
    troupe bench serve --engine --model PATH ...     # Engine.generate in-process: no gateway

Flags this benchmark does not know are `troupe serve` flags (engine and server settings: --model,
--device, --max-num-seqs, ...): passed to the server it starts, or, with --engine, to the
in-process engine. `--serve-arg` passes one whose name the benchmark uses itself (`--seed`).
Workload: serve_workload.py; timing: serve_client.py; metrics: serve_metrics.py; the definitions
side by side with vLLM's: docs/bench_serve.md. Exit status 0 when every request completed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import shlex
import sys
import time
from typing import Any

import aiohttp
from troupe.actors.heap_freeze import frozen_heap
from troupe.config import ConfigError, EngineConfig
from troupe.ops.bench_serve_args import build_parser, ramp_up, sampling_fields
from troupe.ops.serve_client import Client, EngineClient, HttpClient
from troupe.ops.serve_connections import ConnectionCount, connections_to_open, open_connections
from troupe.ops.serve_cpu import ServerCpu, cpu_used, read_server_cpu
from troupe.ops.serve_load import Progress, run_load
from troupe.ops.serve_metrics import RequestResult, compute_metrics, parse_goodput
from troupe.ops.serve_poller import StatsPoller
from troupe.ops.serve_report import (
    print_report,
    rate_json,
    result_json,
    server_cpu_json,
    write_result,
)
from troupe.ops.serve_workload import BenchRequest, LengthSpec, make_requests
from troupe.ops.server_ttft import Buckets, quantiles, read_buckets

_CLIENT_TIMEOUT_S = 6 * 3600  # one request may take long under load; vLLM's bound too


async def _warm_up(client: Client, requests: list[BenchRequest], n: int) -> str | None:
    """Send the first request `n` times, uncounted (compiles kernels, opens connections)."""
    for _ in range(n if requests else 0):
        result = await client.send(requests[0])
        if not result.success:
            return result.error
    return None


async def _drive(
    client: Client, requests: list[BenchRequest], args: argparse.Namespace
) -> tuple[list[RequestResult], float]:
    await _warm(client, requests, args)
    return await _load(client, requests, args)


async def _warm(client: Client, requests: list[BenchRequest], args: argparse.Namespace) -> None:
    if (error := await _warm_up(client, requests, args.num_warmups)) is not None:
        raise RuntimeError(f"the warm-up request failed: {error}")


async def _load(
    client: Client, requests: list[BenchRequest], args: argparse.Namespace
) -> tuple[list[RequestResult], float]:
    progress = Progress(len(requests), enabled=not args.no_progress)
    # As vLLM's benchmark does: this process's start-up heap (torch, when troupe is imported)
    # out of the collector's walks, so that its pauses are not measured as the server's latency
    with frozen_heap(True):
        return await run_load(
            client, requests, max_concurrency=args.max_concurrency, progress=progress
        )


async def _wait_healthy(session: aiohttp.ClientSession, base_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with session.get(f"{base_url}/health") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base_url}/health did not answer 200 within {timeout:g} s")
        await asyncio.sleep(0.2)


# results, duration, model, polls, the server's TTFT histogram before and after the load,
# connections opened before the load
HttpRun = tuple[list[RequestResult], float, str, int, tuple[Buckets | None, Buckets | None], int]


async def _run_http(
    base_url: str, requests: list[BenchRequest], args: argparse.Namespace
) -> HttpRun:
    """Results, duration, model name, how many times /v1/engine/stats was polled, the
    server's own TTFT histogram read after the warm-up and after the load
    (ops/server_ttft.py; None from another server), and the connections opened beforehand."""
    connector = aiohttp.TCPConnector(limit=0)  # --max-concurrency bounds it, as in vLLM
    timeout = aiohttp.ClientTimeout(total=_CLIENT_TIMEOUT_S)
    count = ConnectionCount()
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=[count.trace]
    ) as session:
        await _wait_healthy(session, base_url, args.server_timeout)
        model = args.model_name
        if model is None:
            headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
            async with session.get(f"{base_url}/v1/models", headers=headers) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    raise RuntimeError(f"{base_url}/v1/models answered {resp.status}: {text}")
                model = str((await resp.json())["data"][0]["id"])
        client = HttpClient(
            session,
            base_url,
            model=model,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
            sampling=sampling_fields(args),
            api_key=args.api_key,
            sse_read=args.sse_read,
        )
        auth = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        await _warm(client, requests, args)
        to_open = connections_to_open(
            args.warm_connections,
            num_prompts=len(requests),
            burst=math.isinf(args.request_rate) and args.ramp_up_strategy is None,
            max_concurrency=args.max_concurrency,
        )
        opened = await open_connections(session, base_url, to_open, count) if to_open else 0
        before = await read_buckets(session, base_url, auth)  # after the warm-up: uncounted
        if args.poll_engine_stats is None:
            results, duration = await _load(client, requests, args)
            polls = 0
        else:
            poller = StatsPoller(
                session, base_url, interval=args.poll_engine_stats, api_key=args.api_key
            )
            async with poller:
                results, duration = await _load(client, requests, args)
            if poller.failures:
                raise RuntimeError(
                    f"/v1/engine/stats failed {len(poller.failures)} of {poller.polls} polls: "
                    f"{poller.failures[0]}"
                )
            polls = poller.polls
        after = await read_buckets(session, base_url, auth)
    return results, duration, model, polls, (before, after), opened


def engine_config(engine_args: list[str]) -> EngineConfig:
    """--engine: the flags the benchmark does not know, read as `troupe serve` engine flags."""
    from troupe.ops.cli import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser(prog="troupe bench serve --engine", allow_abbrev=False)
    add_config_arguments(parser)
    ns = parser.parse_args(engine_args)
    try:
        return config_from_args(ns)
    except ConfigError as exc:
        parser.error(str(exc))


async def _run_engine(
    config: EngineConfig, requests: list[BenchRequest], args: argparse.Namespace
) -> tuple[list[RequestResult], float, str]:
    from troupe.actors.engine import Engine
    from troupe.logs import configure_logging

    configure_logging(config.log_format, config.log_level)
    async with Engine.open(config) as engine:
        client = EngineClient(
            engine,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
            sampling=sampling_fields(args),
        )
        results, duration = await _drive(client, requests, args)
        return results, duration, str(engine.model_name)


def _run_started_server(
    serve_args: list[str], requests: list[BenchRequest], args: argparse.Namespace
) -> tuple[HttpRun, str, ServerCpu | None]:
    """The run, and the CPU time its gateway and engine processes used meanwhile."""
    from troupe.ops.bench_soak import ServerProcess

    if args.api_key:
        serve_args = [*serve_args, "--api-key", args.api_key]
    server = ServerProcess(serve_args)
    try:
        base_url = server.wait_ready()  # its message carries the server's last log lines
        before = read_server_cpu(server.pid)
        try:
            run = asyncio.run(_run_http(base_url, requests, args))
        except RuntimeError:
            print("\n".join(server.log_tail), file=sys.stderr)
            raise
        after = read_server_cpu(server.pid)
    finally:
        status = server.stop()
        if status != 0:
            print(f"troupe bench serve: the server exited with {status}", file=sys.stderr)
    cpu = cpu_used(before, after) if before and after else None
    return run, base_url, cpu


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    engine_args = [*extra, *(a for s in args.serve_arg for a in shlex.split(s))]
    try:
        slos = parse_goodput(args.goodput)
        percentiles = [float(p) for p in args.metric_percentiles.split(",")]
        spec = LengthSpec(
            dataset=args.dataset_name,
            input_len=args.input_len,
            output_len=args.output_len,
            range_ratio=args.range_ratio,
            min_input_len=args.min_input_len,
            max_input_len=args.max_input_len,
            min_output_len=args.min_output_len,
            max_output_len=args.max_output_len,
        )
        ramp = ramp_up(args)
        requests = make_requests(
            spec,
            args.num_prompts,
            seed=args.seed,
            request_rate=args.request_rate,
            burstiness=args.burstiness,
            structured_ratio=args.structured_output_ratio,
            ramp=ramp,
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.poll_engine_stats is not None and args.poll_engine_stats <= 0:
        parser.error(f"--poll-engine-stats must be > 0 s, got {args.poll_engine_stats:g}")
    if args.engine and args.poll_engine_stats is not None:
        parser.error("--poll-engine-stats reads the server's endpoint: it takes no --engine")
    if args.warm_connections is not None and args.warm_connections < 0:
        parser.error(f"--warm-connections must be >= 0, got {args.warm_connections}")
    if args.engine and args.warm_connections:
        parser.error("--warm-connections opens HTTP connections: it takes no --engine")
    if args.engine and args.base_url:
        parser.error("--engine runs in this process: it takes no --base-url")
    if args.server_pid is not None and not args.base_url:
        parser.error("--server-pid names the process behind --base-url (a started one is read)")
    if args.base_url and engine_args:
        parser.error(f"engine flags need a server this benchmark starts: {' '.join(engine_args)}")
    if "--log-format" in engine_args:
        parser.error("--log-format: a started server logs JSON (its 'serving' line is read)")

    base_url = args.base_url.rstrip("/") if args.base_url else None
    polls = 0
    cpu: ServerCpu | None = None  # read only from a server this benchmark started
    readings: tuple[Buckets | None, Buckets | None] = (None, None)  # HTTP to a troupe server
    opened = 0  # connections opened before the load (HTTP)
    try:
        if args.engine:
            config = engine_config(engine_args)
            results, duration, model = asyncio.run(_run_engine(config, requests, args))
        elif base_url is not None:
            before = read_server_cpu(args.server_pid) if args.server_pid else None
            run = asyncio.run(_run_http(base_url, requests, args))
            results, duration, model, polls, readings, opened = run
            after = read_server_cpu(args.server_pid) if args.server_pid else None
            cpu = cpu_used(before, after) if before and after else None
        else:
            run, base_url, cpu = _run_started_server(engine_args, requests, args)
            results, duration, model, polls, readings, opened = run
    except RuntimeError as exc:
        print(f"troupe bench serve: {exc}", file=sys.stderr)
        return 2

    metrics = compute_metrics(results, duration, percentiles=percentiles, goodput=slos or None)
    settings: dict[str, Any] = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "mode": "engine" if args.engine else "http",
        "base_url": base_url,
        "model_id": model,
        "dataset_name": args.dataset_name,
        "num_prompts": args.num_prompts,
        "warm_connections": opened,
        "request_rate": rate_json(args.request_rate),
        "burstiness": args.burstiness,
        "ramp_up_strategy": args.ramp_up_strategy,
        "ramp_up_start_rps": args.ramp_up_start_rps,
        "ramp_up_end_rps": args.ramp_up_end_rps,
        "max_concurrency": args.max_concurrency,
        "seed": args.seed,
        "temperature": args.temperature,
        "sampling": sampling_fields(args),
        "ignore_eos": args.ignore_eos,
        "goodput": slos,
        "structured_output_ratio": args.structured_output_ratio,
        "poll_engine_stats_s": args.poll_engine_stats,
        "engine_stats_polls": polls,
        "server_cpu": server_cpu_json(cpu, metrics.total_output),
        "server_ttft_ms": quantiles(*readings, percentiles),
    }
    num_structured = sum(r.schema is not None for r in requests)
    if num_structured:
        valid = sum(r.json_valid is True for r in results)
        settings["structured"] = {"requests": num_structured, "valid_json": valid}
    print_report(metrics, settings, results)
    if args.result_file:
        write_result(args.result_file, result_json(metrics, settings, results))
    return 0 if metrics.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
