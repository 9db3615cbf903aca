"""Websocket frames the server sends: delta, done, error (JSON text)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from troupe.gateway.errors import client_field
from troupe.messages import (
    Aborted,
    Delta,
    Failed,
    FailureCause,
    Finished,
    Rejected,
    StreamEvent,
    TokenLogprob,
    Usage,
)

_json = msgspec.json.Encoder()


def to_json(obj: dict[str, Any]) -> str:
    return _json.encode(obj).decode()


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "cached_tokens": usage.cached_tokens,
    }


def _rows(logprobs: Iterable[TokenLogprob]) -> list[list[Any]]:
    return [[lp.token_id, lp.logprob, list(lp.top)] for lp in logprobs]


def encode_event(
    client_id: str, event: StreamEvent, client_fields: Mapping[str, str] | None = None
) -> Iterable[str]:
    """Engine event -> websocket frames for the client's request id (`client_fields`: renames
    of engine field names, as ws_requests.Generate.client_fields)."""
    if event.text or event.token_ids:
        delta: dict[str, Any] = {
            "type": "delta",
            "request_id": client_id,
            "text": event.text,
            "token_ids": list(event.token_ids),
        }
        if isinstance(event, Delta | Finished):
            if event.logprobs is not None:
                delta["logprobs"] = _rows(event.logprobs)
            if event.prompt_logprobs is not None:  # the first delta: prompt positions 1..
                delta["prompt_logprobs"] = _rows(event.prompt_logprobs)
            if event.embedding is not None:
                delta["embedding"] = list(event.embedding)
        yield to_json(delta)
    match event:
        case Finished():
            yield to_json(
                {
                    "type": "done",
                    "request_id": client_id,
                    "finish_reason": str(event.finish_reason),
                    "stop_reason": event.stop_reason,
                    "usage": _usage(event.usage),
                    "timings": msgspec.structs.asdict(event.timings),
                }
            )
        case Aborted():
            yield to_json(
                {
                    "type": "done",
                    "request_id": client_id,
                    "finish_reason": "abort",
                    "reason": event.reason,
                    "usage": _usage(event.usage),
                    "timings": msgspec.structs.asdict(event.timings),
                }
            )
        case Rejected():
            yield error_frame(
                client_id, str(event.code), event.message, client_field(event.field, client_fields)
            )
        case Failed() if event.cause is FailureCause.GRAMMAR_DEAD_END:  # the client's grammar
            field = client_field("structured_outputs", client_fields)
            yield error_frame(client_id, event.cause, event.message, field)
        case Failed():
            yield error_frame(client_id, "failed", event.message)


def error_frame(request_id: str | None, code: str, message: str, field: str | None = None) -> str:
    return to_json(
        {
            "type": "error",
            "request_id": request_id,
            "code": code,
            "message": message,
            "field": field,
        }
    )


def cancelled_frame(request_id: str) -> str:
    """`done` for a request cancelled before it reached the engine: nothing was computed."""
    return to_json(
        {
            "type": "done",
            "request_id": request_id,
            "finish_reason": "abort",
            "reason": "cancelled by client",
            "usage": {
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "total_tokens": 0,
                "cached_tokens": 0,
            },
            "timings": {"ttft": None, "tpot": None, "e2e": 0.0},
        }
    )
