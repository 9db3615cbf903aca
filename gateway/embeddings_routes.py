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
import dataclasses
import struct
import time
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
import structlog
from aiohttp import web
from troupe.gateway.embeddings_bodies import EmbeddingRequest, parse_embedding_request
from troupe.gateway.errors import ApiError, error_for_event
from troupe.gateway.http_body import read_json_body
from troupe.gateway.pooled_vectors import pooled_vectors
from troupe.gateway.prompt_batch import batch_events
from troupe.gateway.state import GATEWAY, Gateway
from troupe.messages import Aborted, Failed, Rejected

log = structlog.get_logger("troupe.gateway")

_json = msgspec.json.Encoder()
# A single input's rejection names the engine's prompt field; the client wrote `input`.
_CLIENT_FIELDS = {"prompt": "input", "prompt_token_ids": "input"}


async def embeddings(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await embeddings_body(gateway, await read_json_body(request, gateway.settings))
    return web.json_response(body, dumps=lambda o: _json.encode(o).decode())


async def embeddings_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to an embeddings request body (an ApiError for a refused one)."""
    engine = gateway.engine
    settings = gateway.settings
    req = parse_embedding_request(
        raw,
        served_model=gateway.served_models().model_id,
        pooling_type=settings.pooling_type,
        max_inputs=settings.max_embedding_inputs,
    )
    served = gateway.served_models()
    if (lora := served.lora_for(req.model)) is not None:
        req = dataclasses.replace(req, params=msgspec.structs.replace(req.params, lora=lora))
    request_id = f"embd-{uuid.uuid4().hex}"
    if req.user is not None:
        log.debug("request from a named user", request_id=request_id, user=req.user)
    events = batch_events(engine, req.inputs, req.params, request_id, field="input")
    names = [f"input[{i}]" for i in range(len(req.inputs))] if req.is_list else ["input"]
    vectors, usage = await pooled_vectors(gateway, events, names, lambda e: _error(e, req))
    return {
        "id": request_id,
        "object": "list",
        "created": int(time.time()),
        "model": served.name_of(lora),
        "data": [
            {"object": "embedding", "embedding": _encoded(v, req.encoding_format), "index": i}
            for i, v in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens},
    }


def _error(event: Rejected | Aborted | Failed, req: EmbeddingRequest) -> ApiError:
    """The HTTP error for one input's failure; a lone input given in a list is `input[0]`."""
    fields = _CLIENT_FIELDS
    if req.is_list and len(req.inputs) == 1:
        fields = {k: "input[0]" for k in _CLIENT_FIELDS}
    return error_for_event(event, fields)


def _encoded(vector: Sequence[float], encoding_format: str) -> Sequence[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
