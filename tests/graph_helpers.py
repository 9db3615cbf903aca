"""Shared helpers for whole-graph tests with the fake runner."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import anyio
from troupe import Engine
from troupe.messages import Delta, StreamEvent


async def collect(engine: Engine, prompt: Any, params: Any = None, **kw: Any) -> list[StreamEvent]:
    """All events of one request."""
    return [event async for event in engine.generate(prompt, params, **kw)]


async def collect_all(engine: Engine, jobs: Sequence[tuple[Any, Any]]) -> list[list[StreamEvent]]:
    """All events of each (prompt, params) job, in the jobs' order; the jobs submitted
    together (their steps batched)."""
    results: list[list[StreamEvent]] = [[] for _ in jobs]

    async def one(i: int, prompt: Any, params: Any) -> None:
        results[i] = await collect(engine, prompt, params)

    async with anyio.create_task_group() as tg:
        for i, (prompt, params) in enumerate(jobs):
            tg.start_soon(one, i, prompt, params)
    return results


def terminal(events: list[StreamEvent]) -> StreamEvent:
    """The single terminal event, asserting there is exactly one and it comes last."""
    terminals = [e for e in events if not isinstance(e, Delta)]
    assert len(terminals) == 1, f"expected one terminal event, got {terminals}"
    assert events[-1] is terminals[0]
    return terminals[0]


def token_ids(events: list[StreamEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


async def wait_blocks_free(engine: Engine, timeout: float = 10.0) -> None:
    """Wait until the scheduler reports no GPU or CPU block owned by any request."""
    with anyio.fail_after(timeout):
        while True:
            stats = engine.stats()
            if (
                stats.num_gpu_blocks_used == 0
                and stats.num_cpu_blocks_used == 0
                and (stats.num_running + stats.num_waiting + stats.num_swapped == 0)
            ):
                return
            await anyio.sleep(0.01)


def by_index(events: list[StreamEvent]) -> dict[int, list[StreamEvent]]:
    """Events per sample (n > 1); checks one end per sample, and that only the last event ends
    the request."""
    out: dict[int, list[StreamEvent]] = defaultdict(list)
    for event in events:
        out[event.index].append(event)  # type: ignore[union-attr]
    for index, sample in out.items():
        ends = [e for e in sample if not isinstance(e, Delta)]
        assert len(ends) == 1 and sample[-1] is ends[0], (index, sample)
    assert [e.is_terminal for e in events] == [False] * (len(events) - 1) + [True]
    return out
