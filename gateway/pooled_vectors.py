"""The vectors of a batch of pooling requests (/v1/embeddings' and /classify's inputs,
/v1/score's texts).

Each prompt of the batch (gateway/prompt_batch.py) is one engine request whose vector comes on
its first event (`Delta.embedding` / `Finished.embedding`); the one token it generates is
dropped. One prompt the engine turns away, aborts or fails fails the whole batch; leaving
early (that, or a vanished client cancelling the handler) closes the merged stream, which
aborts every prompt's request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, Protocol, cast

import msgspec
import structlog
from troupe.gateway.errors import ApiError, error_for_event
from troupe.gateway.prompt_batch import batch_events, batch_usage
from troupe.gateway.state import Gateway
from troupe.messages import (
    Aborted,
    Failed,
    Finished,
    Rejected,
    SamplingParams,
    StreamEvent,
    Usage,
)

log = structlog.get_logger("troupe.gateway")

Vector = tuple[float, ...]
# A single input's rejection names the engine's prompt field; the client wrote `input`.
_CLIENT_FIELDS = {"prompt": "input", "prompt_token_ids": "input"}


class InputRequest(Protocol):
    """A checked request whose `input` is one prompt or a list (/v1/embeddings, /classify)."""

    @property
    def model(self) -> str | None: ...
    @property
    def inputs(self) -> tuple[str | list[int], ...]: ...
    @property
    def params(self) -> SamplingParams: ...
    @property
    def user(self) -> str | None: ...
    @property
    def is_list(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class InputVectors:
    request_id: str
    model: str  # the answer's `model`: the adapter the request named, or the served model
    vectors: list[Vector]  # one an input, in order
    usage: Usage
    prompt_tokens: tuple[int, ...]  # each input's (the rows of a per-token vector)

    def list_answer(self, data: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
        """The list envelope vLLM's pooling answers share (embeddings, classify, pooling)."""
        return {
            "id": self.request_id,
            "object": "list",
            "created": int(time.time()),
            "model": self.model,
            "data": data,
            "usage": usage,
        }


async def input_vectors(gateway: Gateway, req: InputRequest, id_prefix: str) -> InputVectors:
    """Each input's vector, on the adapter `model` names: one engine request an input, all
    submitted at once; one the engine turns away fails the whole request naming `input[i]`."""
    served = gateway.served_models()
    params = req.params
    if (lora := served.lora_for(req.model)) is not None:
        params = msgspec.structs.replace(params, lora=lora)
    request_id = f"{id_prefix}-{uuid.uuid4().hex}"
    if req.user is not None:
        log.debug("request from a named user", request_id=request_id, user=req.user)
    events = batch_events(gateway.engine, req.inputs, params, request_id, field="input")
    names = [f"input[{i}]" for i in range(len(req.inputs))] if req.is_list else ["input"]
    # a lone input given in a list is `input[0]`
    fields = _CLIENT_FIELDS
    if req.is_list and len(req.inputs) == 1:
        fields = {k: "input[0]" for k in _CLIENT_FIELDS}
    vectors, usages = await _gather(
        gateway, events, names, lambda event: error_for_event(event, fields)
    )
    prompt_tokens = tuple(usages[i].prompt_tokens for i in range(len(names)))
    usage = batch_usage(sorted(usages.items()), 1)
    return InputVectors(request_id, served.name_of(lora), vectors, usage, prompt_tokens)


async def pooled_vectors(
    gateway: Gateway,
    events: AsyncIterator[StreamEvent],
    names: Sequence[str],
    error_for: Callable[[Rejected | Aborted | Failed], ApiError] = error_for_event,
) -> tuple[list[Vector], Usage]:
    """Every prompt's vector, in order, and the batch's usage. `events`: batch_events over
    the prompts, one a `names` entry (the field a missing vector's 500 names); `error_for`:
    the HTTP error for a prompt's failure."""
    vectors, usages = await _gather(gateway, events, names, error_for)
    return vectors, batch_usage(sorted(usages.items()), 1)


async def _gather(
    gateway: Gateway,
    events: AsyncIterator[StreamEvent],
    names: Sequence[str],
    error_for: Callable[[Rejected | Aborted | Failed], ApiError],
) -> tuple[list[Vector], dict[int, Usage]]:
    """Every prompt's vector, in order, and each prompt's usage by its index."""
    vectors: dict[int, Vector] = {}
    usages: dict[int, Usage] = {}
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
                    usages[event.index] = event.usage
                if event.is_terminal:
                    missing = [i for i in range(len(names)) if i not in vectors]
                    if missing:
                        raise ApiError(500, f"the engine gave no embedding for {names[missing[0]]}")
                    return [vectors[i] for i in range(len(names))], usages
    finally:
        gateway.stream_closed()
    raise ApiError(500, "the engine ended the stream without a terminal event")
