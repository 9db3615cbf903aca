"""POST /pooling, vLLM's generic pooling endpoint (`serving_pooling.py` shapes).

    {"id": "pool-...", "object": "list", "created", "model",
     "data": [{"index": i, "object": "pooling", "data": [float, ...] | [[float, ...], ...]
               | "base64..."}],
     "usage": {"prompt_tokens": N, "total_tokens": N, "completion_tokens": 0,
               "prompt_tokens_details": null}}

Each input's `data` is what the task gives: an embedding model's vector (embed, as
/v1/embeddings'), a classification model's scores (classify, as /classify's `probs`: the
activated scores, the logits with `use_activation: false`; a one-label reward model's is
[score]), or a row per prompt token (token_embed, token_classify: [[...], ...] of P rows, as
vLLM's [P, width] tensor; base64 is its float32 bytes row after row, as vLLM encodes it).
Each input is one engine request run through gateway/pooled_vectors.py, as theirs are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from aiohttp import web
from troupe.gateway.classify_routes import pooling_usage
from troupe.gateway.embeddings_routes import encoded_vector
from troupe.gateway.errors import ApiError
from troupe.gateway.http_body import read_json_body
from troupe.gateway.pooled_vectors import input_vectors
from troupe.gateway.pooling_bodies import parse_pooling_request, served_tasks
from troupe.gateway.state import GATEWAY, Gateway

PATHS = ("/pooling",)
_json = msgspec.json.Encoder()


def add_pooling_routes(app: web.Application) -> None:
    for path in PATHS:
        app.router.add_post(path, pooling)


async def pooling(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await pooling_body(gateway, await read_json_body(request, gateway.settings))
    return web.json_response(body, dumps=lambda o: _json.encode(o).decode())


async def pooling_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to a pooling request body (an ApiError for a refused one)."""
    settings = gateway.settings
    engine = gateway.engine
    req = parse_pooling_request(
        raw,
        served_model=gateway.served_models().model_id,
        model_tasks=served_tasks(len(engine.classifier_labels), engine.is_token_classifier),
        pooling_type=settings.pooling_type,
        max_inputs=settings.max_embedding_inputs,
    )
    answer = await input_vectors(gateway, req, "pool")
    is_per_token = req.task in ("token_embed", "token_classify")
    data = []
    for i, vector in enumerate(answer.vectors):
        encoded: object = encoded_vector(vector, req.encoding_format)
        if is_per_token and req.encoding_format == "float":  # base64: the rows' bytes in a row
            encoded = token_rows(vector, answer.prompt_tokens[i])
        data.append({"index": i, "object": "pooling", "data": encoded})
    return answer.list_answer(data, pooling_usage(answer.usage))


def token_rows(vector: Sequence[float], num_rows: int) -> list[Sequence[float]]:
    """A per-token vector as its rows, one a prompt token."""
    if num_rows <= 0 or len(vector) % num_rows:
        raise ApiError(500, f"the engine gave {len(vector)} values for {num_rows} prompt tokens")
    width = len(vector) // num_rows
    return [vector[r * width : (r + 1) * width] for r in range(num_rows)]
