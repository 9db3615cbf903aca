"""POST /classify and /v1/classify, in vLLM's shapes (`serving_classification.py`).

    {"id": "classify-...", "object": "list", "created", "model",
     "data": [{"index": i, "label": str, "probs": [float, ...], "num_classes": n}],
     "usage": {"prompt_tokens": N, "total_tokens": N, "completion_tokens": 0,
               "prompt_tokens_details": null}}

`probs` is the score head's softmax (sigmoid for one label or a multi-label model; the logits
with `use_activation: false`, as vLLM's); `label` names the largest in the model's id2label.
Each input is one engine request run as an embedding's (gateway/prompt_batch.py and
gateway/pooled_vectors.py: one refused input fails the whole request, naming `input[i]`, the
others aborted). A model that is no sequence classifier (a causal LM, a token classifier)
answers 400 naming `model`, as vLLM serves /classify only for the classify task.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web
from troupe.gateway.classify_bodies import parse_classify_request
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.pooled_vectors import input_vectors
from troupe.gateway.state import GATEWAY, Gateway
from troupe.messages import Usage

PATHS = ("/classify", "/v1/classify")
_json = msgspec.json.Encoder()


def add_classify_routes(app: web.Application) -> None:
    for path in PATHS:
        app.router.add_post(path, classify)


async def classify(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await classify_body(gateway, await read_json_body(request, gateway.settings))
    return web.json_response(body, dumps=lambda o: _json.encode(o).decode())


async def classify_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to a classify request body (an ApiError for a refused one)."""
    req = parse_classify_request(raw, max_inputs=gateway.settings.max_embedding_inputs)
    labels = gateway.engine.classifier_labels
    if not labels or gateway.engine.is_token_classifier:
        what = "token-classification model: it serves token_classify (POST /pooling)"
        raise invalid(
            "model",
            f"model {gateway.served_models().model_id!r} is not a sequence-classification model "
            "(a *ForSequenceClassification checkpoint): it does not serve classify requests"
            + (f"; it is a {what}" if labels else ""),
        )
    answer = await input_vectors(gateway, req, "classify")
    data = []
    for i, probs in enumerate(answer.vectors):
        if len(probs) != len(labels):
            raise ApiError(500, f"the engine gave {len(probs)} scores for {len(labels)} labels")
        best = max(range(len(probs)), key=probs.__getitem__)
        data.append({"index": i, "label": labels[best], "probs": probs, "num_classes": len(probs)})
    return answer.list_answer(data, pooling_usage(answer.usage))


def pooling_usage(usage: Usage) -> dict[str, Any]:
    """vLLM's `UsageInfo` of a pooling answer: prompt tokens only."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "total_tokens": usage.prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
