"""POST /v1/embeddings, in OpenAI's and vLLM's shapes.

    {"id": "embd-...", "object": "list", "created", "model",
     "data": [{"object": "embedding", "embedding": [float, ...] | "base64...", "index": i}],
     "usage": {"prompt_tokens": N, "total_tokens": N}}

Each input is one engine request (gateway/prompt_batch.py, as a completion's list of prompts):
all are submitted at once, and one the engine turns away fails the whole request, naming
`input[i]`, the others aborted (gateway/pooled_vectors.py collects the vectors).
`base64` is the vector's float32 bytes, little-endian, as OpenAI's client decodes them (its
default when the caller names no format).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Any

import msgspec
from aiohttp import web
from troupe.gateway.embeddings_bodies import parse_embedding_request
from troupe.gateway.http_body import read_json_body
from troupe.gateway.pooled_vectors import input_vectors
from troupe.gateway.state import GATEWAY, Gateway

_json = msgspec.json.Encoder()


async def embeddings(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await embeddings_body(gateway, await read_json_body(request, gateway.settings))
    return web.json_response(body, dumps=lambda o: _json.encode(o).decode())


async def embeddings_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to an embeddings request body (an ApiError for a refused one)."""
    settings = gateway.settings
    req = parse_embedding_request(
        raw,
        served_model=gateway.served_models().model_id,
        pooling_type=settings.pooling_type,
        max_inputs=settings.max_embedding_inputs,
    )
    answer = await input_vectors(gateway, req, "embd")
    data = [
        {"object": "embedding", "embedding": encoded_vector(v, req.encoding_format), "index": i}
        for i, v in enumerate(answer.vectors)
    ]
    tokens = answer.usage.prompt_tokens
    return answer.list_answer(data, {"prompt_tokens": tokens, "total_tokens": tokens})


def encoded_vector(vector: Sequence[float], encoding_format: str) -> Sequence[float] | str:
    """The vector as `encoding_format` asks: floats, or base64 of little-endian float32."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
