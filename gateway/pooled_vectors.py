"""The vectors of a batch of pooling requests (/v1/embeddings' inputs, /v1/score's texts).

Each prompt of the batch (gateway/prompt_batch.py) is one engine request whose vector comes on
its first event (`Delta.embedding` / `Finished.embedding`); the one token it generates is
dropped. One prompt the engine turns away, aborts or fails fails the whole batch; leaving
early (that, or a vanished client cancelling the handler) closes the merged stream, which
aborts every prompt's request.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import cast

from troupe.gateway.errors import ApiError, error_for_event
from troupe.gateway.prompt_batch import batch_usage
from troupe.gateway.state import Gateway
from troupe.messages import Aborted, Failed, Finished, Rejected, StreamEvent, Usage

Vector = tuple[float, ...]


async def pooled_vectors(
    gateway: Gateway,
    events: AsyncIterator[StreamEvent],
    names: Sequence[str],
    error_for: Callable[[Rejected | Aborted | Failed], ApiError] = error_for_event,
) -> tuple[list[Vector], Usage]:
    """Every prompt's vector, in order, and the batch's usage. `events`: batch_events over
    the prompts, one a `names` entry (the field a missing vector's 500 names); `error_for`:
    the HTTP error for a prompt's failure."""
    vectors: dict[int, Vector] = {}
    usages: list[tuple[int, Usage]] = []
    # an async generator (its aclose ends every prompt's stream), typed as an iterator
    merged = cast(AsyncGenerator[StreamEvent, None], events)
    gateway.stream_opened()
    try:
        async with contextlib.aclosing(merged):
            async for event in merged:
                if isinstance(event, Rejected | Aborted | Failed):
                    raise error_for(event)
                if event.embedding is not None:
                    vectors[event.index] = event.embedding
                if isinstance(event, Finished):
                    usages.append((event.index, event.usage))
                if event.is_terminal:
                    missing = [i for i in range(len(names)) if i not in vectors]
                    if missing:
                        raise ApiError(500, f"the engine gave no embedding for {names[missing[0]]}")
                    return [vectors[i] for i in range(len(names))], batch_usage(usages, 1)
    finally:
        gateway.stream_closed()
    raise ApiError(500, "the engine ended the stream without a terminal event")
