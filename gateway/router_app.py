"""`troupe router`: an HTTP front that spreads OpenAI requests over `troupe serve` replicas.

    POST /v1/completions, /v1/chat/completions,  proxied (gateway/router_proxy.py), each keyed
         /v1/responses, /v1/embeddings,          on its prompt (gateway/router_keys.py) and its
         /v1/score, /score, /v1/rerank,          streams' ends known (gateway/router_streams.py)
         /rerank, /v2/rerank, /classify,
         /v1/classify, /pooling, /invocations,
         /generate, /encode (SGLang's), /v1/messages,
         /v1/messages/count_tokens (Anthropic's)
    GET  /v1/responses/{id}[/input_items],       to the replica storing the response
    DELETE /v1/responses/{id}                    (gateway/router_stored.py; so does a create
                                                 with previous_response_id)
    GET  /v1/models                              what every up replica lists, and
    POST /v1/load_lora_adapter,                  sent to every up replica
         /v1/unload_lora_adapter                 (gateway/router_loras.py)
    GET  /health, GET|POST /ping                 200 while a replica is up, else 503
    GET  /version                                troupe's version
    GET  /metrics                                per-replica counters (gateway/router_metrics.py)
    GET  /v1/router/stats                        the same as JSON

The replicas check API keys themselves: the router forwards `Authorization` unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Callable

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from troupe.gateway.anthropic_errors import MESSAGES_PATH, anthropic_response, is_anthropic_path
from troupe.gateway.errors import ApiError, from_http_exception, internal_error
from troupe.gateway.router_admin import add_admin_routes
from troupe.gateway.router_keys import (
    anthropic_text,
    field_text,
    generate_text,
    invocations_text,
    messages_text,
    responses_text,
)
from troupe.gateway.router_loras import add_lora_routes
from troupe.gateway.router_metrics import render_metrics
from troupe.gateway.router_proxy import ROUTER, SESSION, Endpoint, Handler, proxy_to
from troupe.gateway.router_replicas import ReplicaSet
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.router_stored import add_stored_routes, previous_response
from troupe.gateway.router_streams import ANTHROPIC_EVENTS, RESPONSES_EVENTS
from troupe.gateway.sagemaker_routes import INVOCATIONS_PATH, version
from troupe.gateway.sglang_encode import PATH as ENCODE_PATH
from troupe.gateway.sglang_generate import PATH as GENERATE_PATH

log = structlog.get_logger("troupe.router")

_SCORE, _RERANK = Endpoint(field_text("text_1")), Endpoint(field_text("query"))
PROXIED = {
    "/v1/completions": Endpoint(field_text("prompt")),
    "/v1/chat/completions": Endpoint(messages_text),
    "/v1/responses": Endpoint(responses_text, RESPONSES_EVENTS, previous_response),
    "/v1/embeddings": Endpoint(field_text("input")),
    "/classify": Endpoint(field_text("input")),
    "/v1/classify": Endpoint(field_text("input")),
    "/pooling": Endpoint(field_text("input")),
    "/v1/score": _SCORE,
    "/score": _SCORE,
    "/v1/rerank": _RERANK,
    "/rerank": _RERANK,
    "/v2/rerank": _RERANK,
    INVOCATIONS_PATH: Endpoint(invocations_text),
    GENERATE_PATH: Endpoint(generate_text),
    ENCODE_PATH: Endpoint(generate_text),  # SGLang's /encode: `text` or `input_ids` too
    MESSAGES_PATH: Endpoint(anthropic_text, ANTHROPIC_EVENTS),
    f"{MESSAGES_PATH}/count_tokens": Endpoint(anthropic_text),
}


def build_router_app(replicas: ReplicaSet, session: aiohttp.ClientSession) -> web.Application:
    """The router's app over `replicas`, proxying through `session` (both the caller's)."""
    app = web.Application(client_max_size=replicas.settings.max_body_bytes, middlewares=[_errors])
    app[ROUTER] = replicas
    app[SESSION] = session
    for path, endpoint in PROXIED.items():
        app.router.add_post(path, proxy_to(endpoint))
    add_stored_routes(app)
    add_lora_routes(app)
    add_admin_routes(app)  # /reset_prefix_cache, /update_weights_from_disk: every replica
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)  # SageMaker's health check, GET or POST
    app.router.add_post("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/router/stats", stats)
    return app


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors in OpenAI's shape (Anthropic's on its /v1/messages paths), as a replica's."""
    try:
        return await handler(request)
    except ApiError as exc:
        error = exc
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = from_http_exception(exc)
    except ConnectionError:  # the client went away
        return web.Response(status=499)
    except Exception as exc:  # a bug: answer in shape, keep the traceback in the log
        log.exception("unhandled error", path=request.path)
        error = internal_error(exc)
    if is_anthropic_path(request.path):
        return anthropic_response(error)
    return error.response()


async def health(request: web.Request) -> web.Response:
    replicas = request.app[ROUTER]
    body = {"status": "ok" if replicas.num_up else "no_replica_up", "replicas_up": replicas.num_up}
    return web.json_response(body, status=200 if replicas.num_up else 503)


async def metrics(request: web.Request) -> web.Response:
    body = render_metrics(request.app[ROUTER])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def stats(request: web.Request) -> web.Response:
    replicas = request.app[ROUTER]
    key = replicas.settings.api_key
    if key is not None and not hmac.compare_digest(
        request.headers.get("Authorization", "").encode(), f"Bearer {key}".encode()
    ):
        raise ApiError(401, "missing or invalid API key", code="invalid_api_key")
    rows = [
        {
            "url": r.url,
            "is_up": r.is_up,
            "num_in_flight": r.num_in_flight,
            "num_routed": r.num_routed,
            "num_prefix_hits": r.num_prefix_hits,
            "num_failures": r.num_failures,
            "tree_chars": tree.num_chars,
        }
        for r, tree in zip(replicas.replicas, replicas.policy.trees, strict=True)
    ]
    return web.json_response({"replicas": rows})


async def serve_router(
    settings: RouterSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    stop: asyncio.Event,
    on_ready: Callable[[str, ReplicaSet], None] | None = None,
    shutdown_grace: float = 30.0,
) -> None:
    """Route until `stop` is set; in-flight requests get `shutdown_grace` s to end."""
    replicas = ReplicaSet(settings)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_s)
    connector = aiohttp.TCPConnector(limit=0)  # the replicas bound their own concurrency
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await replicas.check_all(session)
        checks = asyncio.ensure_future(replicas.run_health_checks(session))
        runner = web.AppRunner(
            build_router_app(replicas, session),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=shutdown_grace,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
            bound_host, bound_port = runner.addresses[0][:2]
            url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}"
            log.info("serving", url=url, replicas=list(settings.backend_urls), up=replicas.num_up)
            if on_ready is not None:
                on_ready(url, replicas)
            await stop.wait()
        finally:
            checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checks
            await runner.cleanup()
    log.info("stopped")
