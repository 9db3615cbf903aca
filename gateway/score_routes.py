"""POST /v1/score and /v1/rerank (vLLM's score and rerank APIs) for an embedding model or a
cross-encoder (a one-label sequence classifier).

    /v1/score, /score         -> {"id": "score-...", "object": "list", "created", "model",
                                  "data": [{"index", "object": "score", "score"}, ...],
                                  "usage": {"prompt_tokens", "total_tokens"}}
    /v1/rerank, /rerank,      -> {"id": "rerank-...", "model",
    /v2/rerank (Jina, Cohere)     "usage": {"prompt_tokens", "total_tokens"},
                                  "results": [{"index", "document": {"text"},
                                               "relevance_score"}, ...]}

For an embedding model each distinct text of a request is one engine request that pools it
(actors/score_pairs.py), all submitted at once through prompt_batch, as /v1/embeddings' inputs
are: one the engine turns away fails the whole request naming where the client gave it
(`text_2[1]`, `query`), the others aborted; a vanished client cancels the handler, which closes
the streams and so aborts them. A pair scores the cosine similarity of its texts' vectors, and
`usage` counts each distinct text's prompt tokens once (vLLM counts each pair's two texts, and
a pad token). For a cross-encoder each pair is one request (its two texts as the tokenizer
encodes a pair, classified: the score is the head's activated logit), a refusal naming the
pair's second text, and `usage` counts each pair's tokens.
Rerank results are sorted by score, highest first (ties in the documents' order), cut to top_n.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from aiohttp import web
from troupe.actors.score_pairs import Pairing, cosine_scores, score_kind
from troupe.gateway.errors import invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.pooled_vectors import pooled_vectors
from troupe.gateway.prompt_batch import batch_events
from troupe.gateway.score_bodies import parse_rerank_request, parse_score_request
from troupe.gateway.state import GATEWAY, Gateway
from troupe.messages import Pooling, SamplingParams

# The paths outside /v1/ (vLLM serves both spellings): behind the API key as /v1/* is.
PATHS = ("/score", "/rerank", "/v2/rerank")

_json = msgspec.json.Encoder()


SCORE_PATHS = ("/v1/score", "/score")
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")


def add_score_routes(app: web.Application) -> None:
    for path in SCORE_PATHS:
        app.router.add_post(path, score)
    for path in RERANK_PATHS:
        app.router.add_post(path, rerank)


async def score(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await score_body(gateway, await read_json_body(request, gateway.settings))
    return web.json_response(body, dumps=lambda o: _json.encode(o).decode())


async def rerank(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await rerank_body(gateway, await read_json_body(request, gateway.settings))
    return web.json_response(body, dumps=lambda o: _json.encode(o).decode())


async def score_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to a score request body (an ApiError for a refused one)."""
    settings = gateway.settings
    req = parse_score_request(
        raw, pooling_type=settings.pooling_type, max_texts=settings.max_embedding_inputs
    )
    model, params = _model(gateway, req.model, req.params)
    request_id = f"score-{uuid.uuid4().hex}"
    scores, num_tokens = await _scored(gateway, req.pairing, params, request_id)
    return {
        "id": request_id,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


async def rerank_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to a rerank request body (an ApiError for a refused one)."""
    settings = gateway.settings
    req = parse_rerank_request(
        raw, pooling_type=settings.pooling_type, max_texts=settings.max_embedding_inputs
    )
    model, params = _model(gateway, req.model, req.params)
    request_id = f"rerank-{uuid.uuid4().hex}"
    scores, num_tokens = await _scored(gateway, req.pairing, params, request_id)
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])[: req.top_n]  # stable: ties
    results: list[dict[str, Any]] = []
    for i in ranked:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            result["document"] = {"text": req.documents[i]}
        results.append(result)
    return {
        "id": request_id,
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        "results": results,
    }


def _model(
    gateway: Gateway, model: str | None, params: SamplingParams
) -> tuple[str, SamplingParams]:
    """The answer's `model` and the params on the adapter it names (404 for neither)."""
    served = gateway.served_models()
    if (lora := served.lora_for(model)) is not None:
        params = msgspec.structs.replace(params, lora=lora)
    return served.name_of(lora), params


async def _scored(
    gateway: Gateway, pairing: Pairing, params: SamplingParams, request_id: str
) -> tuple[list[float], int]:
    """Every pair's score, in order, and the prompt tokens the engine ran (an embedding
    model's: each distinct text once; a cross-encoder's: each pair's)."""
    engine = gateway.engine
    model = gateway.served_models().model_id
    try:
        kind = score_kind(model, engine.classifier_labels, engine.is_token_classifier)
    except ValueError as exc:
        raise invalid("model", str(exc)) from None
    if kind == "embed":
        events = batch_events(engine, pairing.texts, params, request_id, names=pairing.names)
        vectors, usage = await pooled_vectors(gateway, events, pairing.names)
        return cosine_scores(vectors, pairing.pairs), usage.prompt_tokens
    prompts = pairing.pair_prompts(engine.tokenizer.encode_pair)
    names = [pairing.names[right] for _, right in pairing.pairs]  # `text_2[i]`, a document
    params = msgspec.structs.replace(params, pooling=Pooling(task="classify"))
    events = batch_events(engine, prompts, params, request_id, names=names)
    vectors, usage = await pooled_vectors(gateway, events, names)
    return [vector[0] for vector in vectors], usage.prompt_tokens
