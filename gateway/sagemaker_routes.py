"""Amazon SageMaker's container endpoints and vLLM's /version, as vLLM serves them.

    GET|POST /ping     -> /health's answer (SageMaker's health check)
    POST /invocations  -> the endpoint the body's fields name, answered as that endpoint
                          answers (streamed where it asks to stream)
    GET /version       -> {"version": "<troupe's>"}

/invocations picks by the fields a body has (gateway/invocation_kind.py, vLLM's order):
`messages` is a chat completion; `prompt` or `prompt_embeds` a completion; `input` a
classification on a sequence classifier, a pooling request on a token classifier, else an
embedding; `text_1` and `text_2` a score; `query` and `documents` a rerank. Anything else is
a 400 naming `body`. /invocations is behind the API key as /v1/* is; /ping and
/version stay open, as /health does.
"""

from __future__ import annotations

import importlib.metadata

import msgspec
from aiohttp import web
from troupe.gateway import openai_routes
from troupe.gateway.browser_policy import Handler
from troupe.gateway.classify_routes import classify
from troupe.gateway.embeddings_routes import embeddings
from troupe.gateway.errors import invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.invocation_kind import NAMES_NONE, InvocationKind, invocation_kind
from troupe.gateway.openai_bodies import decode_body
from troupe.gateway.pooling_routes import pooling
from troupe.gateway.score_routes import rerank, score
from troupe.gateway.state import GATEWAY, Gateway

INVOCATIONS_PATH = "/invocations"


def add_sagemaker_routes(app: web.Application, health: Handler) -> None:
    """/ping answers as `health` (the app's /health handler) does."""
    app.router.add_get("/ping", health)
    app.router.add_post("/ping", health)
    app.router.add_post(INVOCATIONS_PATH, invocations)
    app.router.add_get("/version", version)


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": importlib.metadata.version("troupe")})


async def invocations(request: web.Request) -> web.StreamResponse:
    """Run the body as the endpoint it names (which reads the same body again: aiohttp keeps
    it)."""
    gateway = request.app[GATEWAY]
    fields = decode_body(await read_json_body(request, gateway.settings), dict[str, msgspec.Raw])
    kind = invocation_kind(lambda name: name in fields and bytes(fields[name]) != b"null")
    return await endpoint(kind, gateway)(request)


def endpoint(kind: InvocationKind | None, gateway: Gateway) -> Handler:
    """The handler that answers a body of `kind` on this server (an `input` body goes where
    the model serves it), or a 400 naming `body`."""
    if kind is None:
        raise invalid("body", NAMES_NONE)
    if kind == "input":
        engine = gateway.engine
        if engine.is_token_classifier:
            return pooling
        return classify if engine.classifier_labels else embeddings
    return _HANDLERS[kind]


_HANDLERS: dict[InvocationKind, Handler] = {
    "chat": openai_routes.chat_completions,
    "completion": openai_routes.completions,
    "score": score,
    "rerank": rerank,
}
