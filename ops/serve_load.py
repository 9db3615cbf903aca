"""Drive a workload: send each request at its arrival time, at most N in flight, show progress.

As in vLLM's benchmark, a request past `max_concurrency` waits for a slot after its arrival
time and its clock starts only when it is sent, so TTFT does not include that wait.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from troupe.ops.serve_client import Client
from troupe.ops.serve_metrics import RequestResult
from troupe.ops.serve_workload import BenchRequest


class Progress:
    """A plain-text bar on a terminal (redrawn at most 10 times a second); elsewhere (CI logs,
    pipes) one line per tenth of the run."""

    def __init__(self, total: int, stream: TextIO | None = None, *, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.is_tty = self.stream.isatty()
        self.num_done = self.num_failed = 0
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._last_tenth = 0

    def update(self, result: RequestResult) -> None:
        self.num_done += 1
        self.num_failed += not result.success
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.is_tty:
            if now - self._last_draw >= 0.1 or self.num_done == self.total:
                self._last_draw = now
                end = "\n" if self.num_done == self.total else ""
                self.stream.write(f"\r{self._line(now)}{end}")
                self.stream.flush()
        elif (tenth := 10 * self.num_done // self.total) > self._last_tenth:
            self._last_tenth = tenth
            self.stream.write(self._line(now) + "\n")
            self.stream.flush()

    def _line(self, now: float) -> str:
        width = 30
        filled = width * self.num_done // self.total
        bar = "#" * filled + "." * (width - filled)
        failed = f", {self.num_failed} failed" if self.num_failed else ""
        elapsed = now - self._start
        return f"[{bar}] {self.num_done}/{self.total} requests{failed} {elapsed:6.1f} s"


async def run_load(
    client: Client,
    requests: Sequence[BenchRequest],
    *,
    max_concurrency: int | None = None,
    progress: Progress | None = None,
) -> tuple[list[RequestResult], float]:
    """(one result per request, in order; seconds from the first send to the last answer)."""
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def one(req: BenchRequest) -> RequestResult:
        delay = start + req.arrival_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if slots is None:
            result = await client.send(req)
        else:
            async with slots:
                result = await client.send(req)
        if progress is not None:
            progress.update(result)
        return result

    results = await asyncio.gather(*(one(req) for req in requests))
    return list(results), time.perf_counter() - start
