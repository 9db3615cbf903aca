"""Completions with a list of prompts: each prompt runs as a request of its own, and their
events come back as one request's.

    prompts [p0, p1], n 2 ──► engine requests cmpl-X-0 (p0), cmpl-X-1 (p1)
    events re-indexed prompt-major:  p0's samples 0, 1 ─► choices 0, 1
                                     p1's samples 0, 1 ─► choices 2, 3

A prompt that is turned away (too long, a full queue) fails the whole request, as one bad
field of a body does: every prompt's first event is awaited before any is passed on, and a
`Rejected` among them is the only event given (its field named `prompt[i]`); the others are
aborted. After that the streams are merged as their events come. Each prompt's last event has
its `samples_left` raised by the samples of the prompts still running, so the request's
terminal event (`is_terminal`) is the end of its last sample, as with parallel sampling.
Leaving the merged stream early (a client gone, one sample's failure) closes every prompt's
stream, which aborts its request in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
from troupe.messages import (
    Aborted,
    Failed,
    Finished,
    PromptEmbeds,
    Rejected,
    SamplingParams,
    StreamEvent,
    Usage,
)

_DONE = object()  # a prompt's stream ended


def batch_usage(usages: Sequence[tuple[int, Usage]], n: int) -> Usage:
    """The request's usage from each ended sample's (choice index, usage): each prompt counted
    once (parallel samples share it), every sample's completion tokens."""
    prompt_tokens: dict[int, int] = {}
    cached: dict[int, int] = {}  # a prompt's samples share its blocks: the most any saw
    completion = 0
    for index, usage in usages:
        prompt = index // n
        prompt_tokens[prompt] = usage.prompt_tokens
        cached[prompt] = max(cached.get(prompt, 0), usage.cached_tokens)
        completion += usage.completion_tokens
    return Usage(
        prompt_tokens=sum(prompt_tokens.values()),
        completion_tokens=completion,
        cached_tokens=sum(cached.values()),
    )


def prompt_request_ids(request_id: str, num_prompts: int) -> list[str]:
    """The engine request id each prompt of `batch_events` runs under: `request_id` for a
    lone prompt, else `request_id-i` for prompt i."""
    if num_prompts == 1:
        return [request_id]
    return [f"{request_id}-{i}" for i in range(num_prompts)]


async def batch_events(
    engine: Any,
    prompts: Sequence[str | list[int] | PromptEmbeds],
    params: SamplingParams | Sequence[SamplingParams],
    request_id: str,
    *,
    field: str = "prompt",
    names: Sequence[str] | None = None,
) -> AsyncIterator[StreamEvent]:
    """Every prompt's events as one request's (see the module docstring); a prompt's
    rejection names it as `field[i]` (`input[1]` for /v1/embeddings), or as `names[i]` when
    given (`text_2[1]`, `query` for /v1/score and /v1/rerank), a lone prompt's too.
    `params`: every prompt's, or each prompt's own (their `n` alike)."""
    each = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    assert len(each) == len(prompts) and len({p.n for p in each}) <= 1, "one n for all"
    ids = prompt_request_ids(request_id, len(prompts))
    if len(prompts) == 1:
        one = engine.generate(prompts[0], each[0], request_id=ids[0])
        async with contextlib.aclosing(one):
            async for event in one:
                if names is not None and isinstance(event, Rejected):
                    event = _renamed(event, names[0])
                yield event
        return
    n = each[0].n
    streams = [
        engine.generate(prompt, p, request_id=rid)
        for prompt, p, rid in zip(prompts, each, ids, strict=True)
    ]
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def drain(i: int) -> None:
        # every stream is iterated at once: an engine submits a request on its first read
        try:
            async for event in streams[i]:
                queue.put_nowait((i, event))
        except Exception as exc:  # raised again by the reader below
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, _DONE))

    drains = [asyncio.create_task(drain(i)) for i in range(len(streams))]
    try:
        held: list[tuple[int, Any]] = []  # until every prompt has answered once
        answered: set[int] = set()
        running = len(streams)
        open_samples = [n] * len(prompts)  # each prompt's samples not ended yet
        while running:
            i, event = await queue.get()
            if isinstance(event, Exception):
                raise event
            if event is _DONE:
                running -= 1
            elif isinstance(event, Rejected) and i not in answered:
                name = f"{field}[{i}]" if names is None else names[i]
                yield _renamed(event, name)  # the request fails; the others are aborted
                return
            else:
                held.append((i, event))
            answered.add(i)
            if len(answered) == len(streams):
                pending, held = held, []
                for j, ready in pending:
                    yield _reindexed(ready, j, n, open_samples)
    finally:
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


def _renamed(event: Rejected, named: str) -> Rejected:
    # the engine names a prompt `prompt`, `prompt_token_ids` when it came as token ids, or
    # `prompt_embeds` (input embeddings)
    renamed = (
        named if event.field in ("prompt", "prompt_token_ids", "prompt_embeds") else event.field
    )
    return msgspec.structs.replace(event, field=renamed, message=f"{named}: {event.message}")


def _reindexed(event: StreamEvent, i: int, n: int, open_samples: list[int]) -> StreamEvent:
    if isinstance(event, Rejected):  # not a first event: cannot happen; keep it terminal
        return event
    index = i * n + event.index
    if not isinstance(event, Finished | Aborted | Failed):
        return msgspec.structs.replace(event, index=index)
    open_samples[i] = event.samples_left
    others = sum(open_samples) - event.samples_left
    return msgspec.structs.replace(event, index=index, samples_left=event.samples_left + others)
