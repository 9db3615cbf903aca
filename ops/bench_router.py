"""Shared-prefix chat through `troupe serve --data-parallel-size N`: N replicas vs 1.

The workload: `--num-groups` system prompts of about `--system-words` words each (an agent's
instructions, a RAG document); every request is one group's system prompt plus a short user
question, so requests of a group share a long prefix and groups share none. Requests go out in
a shuffled order, `--max-concurrency` at a time, as streamed chat completions with
`ignore_eos` and `max_tokens=--output-len`. Reported per run: requests/s, output tokens/s, TTFT
and E2E p50/p99, and, from the replicas' own /metrics, the prefix-cache hit rate (tokens served
from the cache / prompt tokens looked up) and, through the router, requests and prefix-routed
requests per replica.

    # on a machine with 2 GPUs: starts each server in turn, same workload, one table
    python -m troupe.ops.bench_router --data-parallel-sizes 1 2 -- --model PATH [engine flags]
    # or against a server already running (a router, or one `troupe serve`)
    python -m troupe.ops.bench_router --base-url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

_WORDS = (
    "alpha bravo cargo delta engine freight gateway harbor invoice journey kilogram ledger "
    "manifest network order parcel quota route schedule tariff unit vessel warehouse zone"
).split()


@dataclass
class Run:
    label: str
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    output_tokens: int = 0
    errors: list[str] = field(default_factory=list)
    duration: float = 0.0
    cache: dict[str, float] = field(default_factory=dict)
    routing: list[dict[str, object]] = field(default_factory=list)


def workload(args: argparse.Namespace) -> list[list[dict[str, str]]]:
    rng = random.Random(args.seed)
    systems = [" ".join(rng.choices(_WORDS, k=args.system_words)) for _ in range(args.num_groups)]
    requests = [
        [{"role": "system", "content": f"[group {g}] {systems[g]}"},
         {"role": "user", "content": f"Question {i}: {' '.join(rng.choices(_WORDS, k=12))}?"}]
        for g in range(args.num_groups) for i in range(args.requests_per_group)
    ]  # fmt: skip
    rng.shuffle(requests)
    return requests


async def _one(session: aiohttp.ClientSession, url: str, messages: object, args: argparse.Namespace, run: Run) -> None:  # fmt: skip
    body = {"messages": messages, "max_tokens": args.output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start, first = time.perf_counter(), None
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                run.errors.append(f"{resp.status}: {(await resp.text())[:200]}")
                return
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    run.errors.append(str(chunk["error"]["message"]))
                    return
                if chunk.get("choices") and first is None:
                    first = time.perf_counter()
                if chunk.get("usage"):
                    run.output_tokens += int(chunk["usage"]["completion_tokens"])
    except aiohttp.ClientError as exc:
        run.errors.append(repr(exc))
        return
    run.ttft.append((first or time.perf_counter()) - start)
    run.e2e.append(time.perf_counter() - start)


async def _metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    # the series of no label but the server's model_name (one model a server)
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if set(s.labels) <= {"model_name"}}  # fmt: skip


async def measure(url: str, label: str, args: argparse.Namespace) -> Run:
    run = Run(label)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        replicas = [url]
        async with s.get(f"{url}/v1/router/stats") as resp:
            if resp.status == 200:
                replicas = [r["url"] for r in (await resp.json())["replicas"]]
        before = [await _metrics(s, r) for r in replicas]
        gate = asyncio.Semaphore(args.max_concurrency)

        async def bounded(messages: object) -> None:
            async with gate:
                await _one(s, url, messages, args, run)

        start = time.perf_counter()
        await asyncio.gather(*(bounded(m) for m in workload(args)))
        run.duration = time.perf_counter() - start
        after = [await _metrics(s, r) for r in replicas]
        for key in (
            "troupe_prefix_cache_hit_tokens_total",
            "troupe_prefix_cache_query_tokens_total",
        ):
            run.cache[key] = sum(a.get(key, 0.0) - b.get(key, 0.0) for a, b in zip(after, before, strict=True))  # fmt: skip
        async with s.get(f"{url}/v1/router/stats") as resp:
            if resp.status == 200:
                run.routing = (await resp.json())["replicas"]
    return run


def ms(xs: list[float], q: float) -> float:
    return 1000 * float(np.percentile(xs, q)) if xs else float("nan")


def report(runs: list[Run]) -> str:
    head = f"{'run':<10}{'req/s':>8}{'out tok/s':>11}{'TTFT p50':>10}{'TTFT p99':>10}{'E2E p50':>9}{'E2E p99':>9}{'cache hit':>10}{'errors':>8}"  # fmt: skip
    lines = [head]
    for r in runs:
        hit = r.cache.get("troupe_prefix_cache_hit_tokens_total", 0.0)
        looked = r.cache.get("troupe_prefix_cache_query_tokens_total", 0.0) or float("nan")
        lines.append(
            f"{r.label:<10}{len(r.e2e) / r.duration:>8.2f}{r.output_tokens / r.duration:>11.1f}"
            f"{ms(r.ttft, 50):>10.1f}{ms(r.ttft, 99):>10.1f}{ms(r.e2e, 50):>9.1f}"
            f"{ms(r.e2e, 99):>9.1f}{hit / looked:>10.1%}{len(r.errors):>8}"
        )
        for row in r.routing:
            lines.append(f"    {row['url']}: {row['num_routed']} routed, {row['num_prefix_hits']} by prefix")  # fmt: skip
    return "\n".join(lines)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m troupe.ops.bench_router", description=__doc__.splitlines()[0])  # fmt: skip
    p.add_argument("--base-url", default=None, help="a running server (else servers are started)")
    p.add_argument("--data-parallel-sizes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--num-groups", type=int, default=16, help="distinct system prompts")
    p.add_argument("--requests-per-group", type=int, default=32)
    p.add_argument("--system-words", type=int, default=1500, help="~1.3 tokens per word")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", default=None, help="write the runs as JSON here")
    if "--" in argv:
        i = argv.index("--")
        return p.parse_args(argv[:i]), argv[i + 1 :]
    return p.parse_args(argv), []


def main(argv: list[str] | None = None) -> int:
    args, serve_args = parse(sys.argv[1:] if argv is None else argv)
    runs: list[Run] = []
    if args.base_url is not None:
        runs.append(asyncio.run(measure(args.base_url.rstrip("/"), "given", args)))
    else:
        from troupe.ops.bench_soak import ServerProcess

        for size in args.data_parallel_sizes:
            server = ServerProcess([*serve_args, "--data-parallel-size", str(size)])
            try:
                url = server.wait_ready()
                runs.append(asyncio.run(measure(url, f"dp={size}", args)))
            finally:
                server.stop()
    print(report(runs))
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump([r.__dict__ for r in runs], f, indent=1)
    return 1 if any(r.errors for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
