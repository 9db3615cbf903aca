"""Soak test: thousands of mixed client requests against a server, then a leak check.

    troupe bench soak                                   # starts `troupe serve --runner fake`
    troupe bench soak --requests 5000 --runner model --serve-arg=--device=cpu
    troupe bench soak --base-url http://127.0.0.1:8000 --pid 12345

Requests go over HTTP (OpenAI completions and chat, JSON and SSE) and websockets; a share is
cut mid-stream or cancelled (soak_workload.py). After a warm-up the server's RSS and open FDs
are sampled; at the end, once /metrics reads idle (or a settle deadline passes), the checks in
soak_checks.py run. Exit status: 0 when every check passes, 1 on any loss or leak, and a
started server must also shut down cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import aiohttp
from troupe.gateway.serve_process import serving_url, stop_serving
from troupe.ops.soak_checks import (
    Check,
    Outcome,
    ProcessSample,
    check_metrics,
    check_outcomes,
    check_process,
    is_idle,
    losses,
    sample_process,
    summarize,
)
from troupe.ops.soak_workload import Workload, make_specs

SETTLE_SECONDS = 15.0  # after the last request: for aborts to free blocks, sockets to close


@dataclass
class SoakReport:
    outcomes: list[Outcome]
    checks: list[Check]
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def is_ok(self) -> bool:
        return all(check.is_ok for check in self.checks)


class ServerProcess:
    """`python -m troupe serve` on a free port; its log is drained so it never blocks."""

    def __init__(self, serve_args: list[str]) -> None:
        command = [sys.executable, "-m", "troupe", "serve", "--port", "0", "--log-format", "json"]
        self._proc = subprocess.Popen(
            [*command, *serve_args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.pid = self._proc.pid
        self.log_tail: collections.deque[str] = collections.deque(maxlen=40)

    def wait_ready(self) -> str:
        """The server's URL, from its `serving` log line (blocking: run in a thread)."""
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.log_tail.append(line.rstrip())
            if (url := serving_url(line)) is not None:
                threading.Thread(target=self._drain, daemon=True).start()
                return url
        raise RuntimeError("the server exited before serving:\n" + "\n".join(self.log_tail))

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (a graceful drain), then the exit status; None if it had to be killed."""
        return stop_serving(self._proc, timeout)

    def _drain(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.log_tail.append(line.rstrip())


async def settle(
    base_url: str, pid: int | None, timeout: float
) -> tuple[str, ProcessSample | None]:
    """Wait until /metrics reads idle and the server's FD count stops falling; sample both."""
    deadline = time.monotonic() + timeout
    text = ""
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(f"{base_url}/metrics") as resp:
                text = await resp.text()
            if is_idle(text) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    if pid is None:
        return text, None
    # Connections the client just closed take a moment to close on the server's side too.
    samples = [sample_process(pid)]
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        samples.append(sample_process(pid))
        if len(samples) >= 5 and len({s.num_fds for s in samples[-5:]}) == 1:
            break
    return text, samples[-1]


async def run_soak(
    base_url: str,
    *,
    num_requests: int,
    pid: int | None = None,
    seed: int = 0,
    concurrency: int = 32,
    num_warmup: int | None = None,
    max_rss_growth_mb: float = 64.0,
    max_fd_growth: int = 8,
    oversize_bytes: int = 1_000_000,
    settle_seconds: float = SETTLE_SECONDS,
) -> SoakReport:
    """Run the workload against a server that is already up; return the checks."""
    start = time.perf_counter()
    specs = make_specs(num_requests, seed)
    if num_warmup is None:
        num_warmup = min(100, num_requests // 10)
    num_warmup = min(num_warmup, num_requests)
    workload = Workload(base_url, concurrency=concurrency, oversize_bytes=oversize_bytes)
    # Warm-up: caches, pools and connections settle before the baseline is taken.
    outcomes = await workload.run(specs[:num_warmup])
    _, before = await settle(base_url, pid, settle_seconds)
    outcomes += await workload.run(specs[num_warmup:])
    metrics_text, after = await settle(base_url, pid, settle_seconds)
    checks = check_outcomes(outcomes, num_requests) + check_metrics(metrics_text)
    notes = []
    if before is not None and after is not None:
        checks += check_process(
            before, after, max_rss_growth_mb=max_rss_growth_mb, max_fd_growth=max_fd_growth
        )
    else:
        notes.append("server RSS/FDs not checked: pass --pid for a server on this host")
    return SoakReport(outcomes, checks, time.perf_counter() - start, notes)


def print_report(report: SoakReport, title: str) -> None:
    print(title)
    head = f"{'kind':<18}{'n':>6}{'finished':>9}{'aborted':>8}{'error':>7}{'cut':>6}{'lost':>6}"
    head += f"{'doubled':>8}"
    print(f"{head}{'p50 ms':>9}{'p99 ms':>9}")
    table = summarize(report.outcomes)
    for kind, row in table.items():
        print(
            f"{kind:<18}{row['n']:>6.0f}{row['finished']:>9.0f}{row['aborted']:>8.0f}"
            f"{row['error']:>7.0f}"
            f"{row['cut']:>6.0f}{row['lost']:>6.0f}{row['doubled']:>8.0f}"
            f"{row['p50_ms']:>9.1f}{row['p99_ms']:>9.1f}"
        )
    rate = len(report.outcomes) / report.seconds if report.seconds else 0.0
    print(f"{len(report.outcomes)} requests in {report.seconds:.1f} s ({rate:.0f}/s)")
    for check in report.checks:
        print(f"  {'ok  ' if check.is_ok else 'FAIL'}  {check.name:<46} {check.value}")
    for note in report.notes:
        print(f"  note: {note}")
    for loss in losses(report.outcomes):
        print(f"  lost: {loss}")
    print("PASS" if report.is_ok else "FAIL")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="troupe bench soak", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests in all")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--seed", type=int, default=0, help="draws the mix of request kinds")
    parser.add_argument(
        "--warmup", type=int, default=None, help="requests before the RSS/FD baseline (N/10)"
    )
    parser.add_argument("--base-url", default=None, help="a running server (else one is started)")
    parser.add_argument("--pid", type=int, default=None, help="that server's pid, for RSS/FDs")
    parser.add_argument("--runner", choices=["fake", "model"], default="fake")
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="extra `troupe serve` flag (repeatable)"
    )
    parser.add_argument("--max-rss-growth-mb", type=float, default=64.0)
    parser.add_argument("--max-fd-growth", type=int, default=8)
    parser.add_argument("--oversize-bytes", type=int, default=1_000_000)
    args = parser.parse_args(argv)

    server = None
    base_url, pid = args.base_url, args.pid
    if base_url is None:
        serve_args = ["--runner", args.runner, *(a for s in args.serve_arg for a in shlex.split(s))]
        server = ServerProcess(serve_args)
        pid = server.pid
        try:
            base_url = server.wait_ready()
        except RuntimeError as exc:
            print(f"troupe bench soak: {exc}", file=sys.stderr)
            server.stop()
            return 2
    try:
        report = asyncio.run(
            run_soak(
                base_url,
                num_requests=args.requests,
                pid=pid,
                seed=args.seed,
                concurrency=args.concurrency,
                num_warmup=args.warmup,
                max_rss_growth_mb=args.max_rss_growth_mb,
                max_fd_growth=args.max_fd_growth,
                oversize_bytes=args.oversize_bytes,
            )
        )
    finally:
        status = server.stop() if server is not None else 0
    if server is not None:
        report.checks.append(Check("server exits 0 on SIGTERM", f"{status}", status == 0))
    where = f"server {base_url}" + (f" (pid {pid}, {args.runner} runner)" if server else "")
    title = f"troupe bench soak: {args.requests} requests, concurrency {args.concurrency}, {where}"
    print_report(report, title)
    return 0 if report.is_ok else 1


if __name__ == "__main__":
    sys.exit(main())
