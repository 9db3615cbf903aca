"""The aiohttp application: routes, the middleware chain, health, metrics, page.

Middleware, outermost first: errors (every error in OpenAI's shape; a vanished client is
routine), browser_guard (pages of unlisted origins get 403; CORS for listed ones), auth (the
API key on /v1/* and the work paths beside it), drain (503 for new work while shutting down).

The page is static files (gateway/static: HTML, CSS, plain JS modules, no build step and no
CDN), served under a Content-Security-Policy that allows only this server's own scripts and
connections: model text the page renders can never run as script.
"""

from __future__ import annotations

import hmac
import html
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from troupe.gateway import openai_routes
from troupe.gateway.admin_routes import ADMIN_PATHS, add_admin_routes
from troupe.gateway.anthropic_errors import anthropic_response, is_anthropic_path
from troupe.gateway.anthropic_routes import add_anthropic_routes
from troupe.gateway.browser_policy import add_cors_headers, browser_guard
from troupe.gateway.classify_routes import PATHS as CLASSIFY_PATHS
from troupe.gateway.classify_routes import add_classify_routes
from troupe.gateway.embeddings_routes import embeddings
from troupe.gateway.engine_api import EngineLike
from troupe.gateway.engine_view import add_engine_view
from troupe.gateway.errors import ApiError, from_http_exception, internal_error
from troupe.gateway.lora_routes import add_lora_routes
from troupe.gateway.models_routes import add_models_routes
from troupe.gateway.pooling_routes import PATHS as POOLING_PATHS
from troupe.gateway.pooling_routes import add_pooling_routes
from troupe.gateway.profile_routes import PROFILE_PATHS, add_profile_routes
from troupe.gateway.responses_routes import responses
from troupe.gateway.responses_stored_routes import add_stored_response_routes
from troupe.gateway.sagemaker_routes import INVOCATIONS_PATH, add_sagemaker_routes
from troupe.gateway.score_routes import PATHS as SCORE_PATHS
from troupe.gateway.score_routes import add_score_routes
from troupe.gateway.sglang_admin import PATHS as SGLANG_ADMIN_PATHS
from troupe.gateway.sglang_admin import add_sglang_admin_routes
from troupe.gateway.sglang_encode import PATH as ENCODE_PATH
from troupe.gateway.sglang_encode import add_encode_route
from troupe.gateway.sglang_generate import PATH as GENERATE_PATH
from troupe.gateway.sglang_generate import add_generate_route
from troupe.gateway.state import GATEWAY, Gateway, GatewaySettings
from troupe.gateway.tokenize_routes import PATHS as TOKENIZE_PATHS
from troupe.gateway.tokenize_routes import add_tokenize_routes
from troupe.gateway.websocket import websocket
from troupe.gateway.ws_auth import key_from_protocols

log = structlog.get_logger("troupe.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

STATIC = Path(__file__).parent / "static"
# Paths outside /v1/ that start engine work: drained at shutdown as /v1/* is
_WORK_PATHS = (INVOCATIONS_PATH, GENERATE_PATH, ENCODE_PATH)
# Paths outside /v1/ behind the API key: each runs the engine's work or changes its state.
_KEYED_PATHS = frozenset(
    (
        *TOKENIZE_PATHS,
        *SCORE_PATHS,
        *CLASSIFY_PATHS,
        *POOLING_PATHS,
        *ADMIN_PATHS,
        *_WORK_PATHS,
        *SGLANG_ADMIN_PATHS,
        *PROFILE_PATHS,
    )
)
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def build_app(engine: EngineLike, settings: GatewaySettings | None = None) -> web.Application:
    """An app serving `engine`; the engine's lifetime is the caller's business."""
    settings = settings or GatewaySettings()
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[_errors, browser_guard, _auth, _drain],
    )
    app[GATEWAY] = gateway = Gateway(engine, settings)
    app.on_shutdown.append(lambda _: gateway.background.close())
    app.on_response_prepare.append(add_cors_headers)
    if settings.enable_request_id_headers:
        app.on_response_prepare.append(_echo_request_id)
    app.router.add_get("/", playground)
    app.router.add_static("/static/", STATIC)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    add_models_routes(app)
    app.router.add_post("/v1/completions", openai_routes.completions)
    app.router.add_post("/v1/chat/completions", openai_routes.chat_completions)
    app.router.add_post("/v1/responses", responses)
    add_anthropic_routes(app)  # /v1/messages, /v1/messages/count_tokens
    add_stored_response_routes(app)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/ws", websocket)
    add_engine_view(app)
    add_tokenize_routes(app)
    add_score_routes(app)
    add_classify_routes(app)
    add_pooling_routes(app)
    add_lora_routes(app)  # with settings.allow_runtime_lora_updating only
    add_admin_routes(app)  # the update with settings.allow_runtime_weight_updating only
    add_sagemaker_routes(app, health)  # /ping, /invocations, /version
    add_generate_route(app)  # SGLang's /generate
    add_encode_route(app)  # SGLang's /encode (an embedding model's vectors)
    add_sglang_admin_routes(app)  # SGLang's /get_model_info, /flush_cache, /abort_request, ...
    add_profile_routes(app)  # /start_profile, /stop_profile (the engine's --profiler-dir)
    return app


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """vLLM's --enable-request-id-headers: the request's X-Request-Id comes back (a fresh one
    where it sent none), on streams too (this runs as the head is sent)."""
    if not isinstance(response, web.WebSocketResponse):
        response.headers["X-Request-Id"] = request.headers.get("X-Request-Id") or uuid.uuid4().hex


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves in OpenAI's shape, aiohttp's own (404, 405, 413) included (Anthropic's
    on its /v1/messages paths)."""
    try:
        return await handler(request)
    except ApiError as exc:
        error = exc
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = from_http_exception(exc)
    except ConnectionError:
        # The client went away mid-answer: routine, and nobody is left to answer. aiohttp's
        # own write of this response fails quietly too.
        log.debug("client went away", path=request.path)
        return web.Response(status=499)
    except Exception as exc:  # a bug: answer in shape, keep the traceback in the log
        log.exception("unhandled error", path=request.path)
        error = internal_error(exc)
    if is_anthropic_path(request.path):
        return anthropic_response(error)
    response: web.Response = error.response()
    return response


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With an api key set, /v1/* and the work and admin paths beside it (_KEYED_PATHS:
    /tokenize, /classify, /pooling, /score, /invocations, /reset_prefix_cache, ...) need
    `Authorization: Bearer <key>` (or `x-api-key: <key>`, as Anthropic's SDK sends it).
    Browsers cannot set headers on a websocket: it may send the key as a subprotocol
    (gateway/ws_auth.py; the page does) or, for old clients, as `?api_key=`."""
    key = request.app[GATEWAY].settings.api_key
    path = request.path
    if key is None or not (path.startswith("/v1/") or path in _KEYED_PATHS):
        return await handler(request)
    given = request.headers.get("Authorization", "")
    token = given[7:] if given[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
    if not token and request.path == "/v1/ws":
        protocols = request.headers.get("Sec-WebSocket-Protocol", "")
        token = key_from_protocols(protocols) or request.query.get("api_key", "")
    if not token:
        raise ApiError(
            401, "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key"
        )
    if not hmac.compare_digest(token.encode(), key.encode()):
        raise ApiError(401, "invalid API key", code="invalid_api_key")
    return await handler(request)


@web.middleware
async def _drain(request: web.Request, handler: Handler) -> web.StreamResponse:
    """While shutting down, new work gets 503; in-flight requests run on to their deadline."""
    path = request.path
    if request.app[GATEWAY].is_draining and (path.startswith("/v1/") or path in _WORK_PATHS):
        if request.method == "POST" or path == "/v1/ws":
            raise ApiError(
                503,
                "the server is shutting down",
                code="shutting_down",
                headers={"Retry-After": "5"},
            )
    return await handler(request)


async def health(request: web.Request) -> web.Response:
    """200 while serving; 503 once draining (load balancers stop sending work) or once the
    engine has failed (a supervisor restarts the process; `error` says why, e.g. "engine dead:
    tensor-parallel worker failed: ..."). `home_id`: what the ids of the responses stored here
    carry (the router sends their reads here)."""
    gateway = request.app[GATEWAY]
    if not gateway.engine.is_healthy:
        body = {"status": "failed", "error": gateway.engine.failure or "the engine stopped"}
        return web.json_response(body, status=503)
    if gateway.is_draining:
        return web.json_response({"status": "draining"}, status=503)
    model = gateway.served_models().model_id
    body = {"status": "ok", "model": model, "home_id": gateway.home_id}
    return web.json_response(body)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def playground(request: web.Request) -> web.Response:
    """The page (chat and live engine view); the model name is filled in here."""
    page = (STATIC / "index.html").read_text("utf-8")
    model = html.escape(request.app[GATEWAY].served_models().model_id)
    return web.Response(
        text=page.replace("__TROUPE_MODEL__", model),
        content_type="text/html",
        headers=_PAGE_HEADERS,
    )
