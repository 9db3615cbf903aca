"""The OpenAI endpoints that answer one JSON body, as calls without a transport.

    answer(gateway, "/v1/chat/completions", raw body) -> Answer(status, body)

Each route's handler reads the HTTP body and calls the same function (`chat_body`,
`embeddings_body`, ...), so a body answered here is the one the server answers, errors included:
a refused request is its ApiError's status and OpenAI error body, and a bug is the 500 the app's
error middleware makes of it. `troupe run-batch` (ops/run_batch.py) drives these. A request
asking to stream is refused naming `stream` (there is no stream to answer on), as OpenAI's
Batch API refuses it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog
from troupe.gateway.classify_routes import PATHS as CLASSIFY_PATHS
from troupe.gateway.classify_routes import classify_body
from troupe.gateway.embeddings_routes import embeddings_body
from troupe.gateway.errors import ApiError, internal_error
from troupe.gateway.openai_routes import chat_body, completions_body
from troupe.gateway.pooling_routes import PATHS as POOLING_PATHS
from troupe.gateway.pooling_routes import pooling_body
from troupe.gateway.responses_routes import responses_body
from troupe.gateway.score_routes import RERANK_PATHS, SCORE_PATHS, rerank_body, score_body
from troupe.gateway.state import Gateway

log = structlog.get_logger("troupe.gateway")

JsonCall = Callable[[Gateway, bytes], Awaitable[dict[str, Any]]]

JSON_CALLS: dict[str, JsonCall] = {
    "/v1/completions": completions_body,
    "/v1/chat/completions": chat_body,
    "/v1/responses": responses_body,
    "/v1/embeddings": embeddings_body,
    **{path: classify_body for path in CLASSIFY_PATHS},
    **{path: pooling_body for path in POOLING_PATHS},
    **{path: score_body for path in SCORE_PATHS},
    **{path: rerank_body for path in RERANK_PATHS},
}


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """An HTTP status and the JSON body the server sends with it."""

    status: int
    body: dict[str, Any]

    @property
    def error(self) -> dict[str, Any] | None:
        """The body's OpenAI error object, for an error status."""
        if self.status < 400:
            return None
        error: dict[str, Any] = self.body["error"]
        return error


async def answer(gateway: Gateway, path: str, raw: bytes) -> Answer:
    """Run the request `raw` (a JSON body) as POST `path` would (a key of JSON_CALLS)."""
    call = JSON_CALLS[path]
    try:
        return Answer(status=200, body=await call(gateway, raw))
    except ApiError as exc:
        return Answer(status=exc.status, body=exc.body())
    except Exception as exc:  # a bug: answered in shape, as the app's middleware does
        log.exception("unhandled error", path=path)
        return Answer(status=500, body=internal_error(exc).body())
