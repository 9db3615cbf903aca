"""POST /classify and /v1/classify, in vLLM's shapes (`serving_classification.py`).

    {"id": "classify-...", "object": "list", "created", "model",
     "data": [{"index": i, "label": str, "probs": [float, ...], "num_classes": n}],
     "usage": {"prompt_tokens": N, "total_tokens": N, "completion_tokens": 0,
               "prompt_tokens_details": null}}

`probs` is the score head's softmax (sigmoid for one label or a multi-label model; the logits
with `use_activation: false`, as vLLM's); `label` names the largest in the model's id2label.
Each input is one engine request run as an embedding's (gateway/prompt_batch.py and
gateway/pooled_vectors.py: one refused input fails the whole request, naming `input[i]`, the
others aborted). A model that is no classifier answers 400 naming `model`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

import msgspec
import structlog
from aiohttp import web
from troupe.gateway.classify_bodies import ClassifyRequest, parse_classify_request
from troupe.gateway.errors import ApiError, error_for_event, invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.pooled_vectors import pooled_vectors
from troupe.gateway.prompt_batch import batch_events
from troupe.gateway.state import GATEWAY, Gateway
from troupe.messages import Aborted, Failed, Rejected

log = structlog.get_logger("troupe.gateway")

PATHS = ("/classify", "/v1/classify")
_json = msgspec.json.Encoder()
_CLIENT_FIELDS = {"prompt": "input", "prompt_token_ids": "input"}


def add_classify_routes(app: web.Application) -> None:
    for path in PATHS:
        app.router.add_post(path, classify)


async def classify(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await classify_body(gateway, await read_json_body(request, gateway.settings))
    return web.json_response(body, dumps=lambda o: _json.encode(o).decode())


async def classify_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to a classify request body (an ApiError for a refused one)."""
    engine = gateway.engine
    req = parse_classify_request(raw, max_inputs=gateway.settings.max_embedding_inputs)
    labels = engine.classifier_labels
    served = gateway.served_models()
    if not labels:
        raise invalid(
            "model",
            f"model {served.model_id!r} is not a sequence-classification model "
            "(a *ForSequenceClassification checkpoint): it does not serve classify requests",
        )
    if (lora := served.lora_for(req.model)) is not None:
        req = dataclasses.replace(req, params=msgspec.structs.replace(req.params, lora=lora))
    request_id = f"classify-{uuid.uuid4().hex}"
    if req.user is not None:
        log.debug("request from a named user", request_id=request_id, user=req.user)
    events = batch_events(engine, req.inputs, req.params, request_id, field="input")
    names = [f"input[{i}]" for i in range(len(req.inputs))] if req.is_list else ["input"]
    vectors, usage = await pooled_vectors(gateway, events, names, lambda e: _error(e, req))
    data = []
    for i, probs in enumerate(vectors):
        if len(probs) != len(labels):
            raise ApiError(500, f"the engine gave {len(probs)} scores for {len(labels)} labels")
        best = max(range(len(probs)), key=probs.__getitem__)
        data.append({"index": i, "label": labels[best], "probs": probs, "num_classes": len(probs)})
    return {
        "id": request_id,
        "object": "list",
        "created": int(time.time()),
        "model": served.name_of(lora),
        "data": data,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "total_tokens": usage.prompt_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }


def _error(event: Rejected | Aborted | Failed, req: ClassifyRequest) -> ApiError:
    """The HTTP error for one input's failure; a lone input given in a list is `input[0]`."""
    fields = _CLIENT_FIELDS
    if req.is_list and len(req.inputs) == 1:
        fields = {k: "input[0]" for k in _CLIENT_FIELDS}
    return error_for_event(event, fields)
