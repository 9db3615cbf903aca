"""POST /pooling, vLLM's generic pooling endpoint (`serving_pooling.py` shapes).

    {"id": "pool-...", "object": "list", "created", "model",
     "data": [{"index": i, "object": "pooling", "data": [float, ...] | "base64..."}],
     "usage": {"prompt_tokens": N, "total_tokens": N, "completion_tokens": 0,
               "prompt_tokens_details": null}}

Each input's `data` is what the model's own endpoint gives: an embedding model's vector (as
/v1/embeddings'), a classification model's scores (as /classify's `probs`: the activated
scores, the logits with `use_activation: false`; a one-label reward model's is [score]).
Each input is one engine request run through gateway/pooled_vectors.py, as theirs are.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web
from troupe.gateway.classify_routes import pooling_usage
from troupe.gateway.embeddings_routes import encoded_vector
from troupe.gateway.http_body import read_json_body
from troupe.gateway.pooled_vectors import input_vectors
from troupe.gateway.pooling_bodies import parse_pooling_request
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
    req = parse_pooling_request(
        raw,
        served_model=gateway.served_models().model_id,
        model_task="classify" if gateway.engine.classifier_labels else "embed",
        pooling_type=settings.pooling_type,
        max_inputs=settings.max_embedding_inputs,
    )
    answer = await input_vectors(gateway, req, "pool")
    data = [
        {"index": i, "object": "pooling", "data": encoded_vector(v, req.encoding_format)}
        for i, v in enumerate(answer.vectors)
    ]
    return answer.list_answer(data, pooling_usage(answer.usage))
