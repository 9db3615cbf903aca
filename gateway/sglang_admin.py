"""SGLang's native admin endpoints, for clients written against SGLang's server (RL trainers
drive rollouts through them). Behind the API key as /v1/* is.

    GET  /get_model_info       {"model_path", "tokenizer_path", "is_generation",
                               "preferred_sampling_params": null, "weight_version"}
    GET  /health_generate      runs one token (prompt: token id 0); 200 once the engine
                               answers it, 503 when it refuses (shutting down, failed) or
                               sleeps
    GET|POST /flush_cache      the prefix cache dropped (troupe's reset: blocks a running
                               request holds stay); 200 "Cache flushed."
    POST /abort_request        {"rid", "abort_all"}: the /generate requests of that rid are
                               aborted (their answers end with finish_reason "abort"), or
                               every request with abort_all; 200 whether or not one ran
    GET|POST /release_memory_occupation, /resume_memory_occupation
                               sleep mode: Engine.sleep(level 1: weights kept in CPU memory,
                               KV cache dropped; waits for the requests in flight) and
                               Engine.wake_up (`tags` as sent: weights, kv_cache; a
                               release names both or none), answered as /sleep and
                               /wake_up are (gateway/sleep_routes.py)
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
from aiohttp import web
from troupe.actors.engine_stopped import EngineStopped
from troupe.gateway.errors import invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.openai_bodies import decode_body
from troupe.gateway.sglang_generate import RIDS
from troupe.gateway.sleep_routes import answer_sleep_call, engine_stopped
from troupe.gateway.state import GATEWAY
from troupe.messages import Delta, Finished, SamplingParams

RELEASE, RESUME = "/release_memory_occupation", "/resume_memory_occupation"
PATHS = ("/get_model_info", "/health_generate", "/flush_cache", "/abort_request", RELEASE, RESUME)


class AbortBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    rid: str = ""
    abort_all: bool = False


class MemoryBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tags: list[str] | None = None  # SGLang's: what to release or resume (None: all)


_ALL = {"weights", "kv_cache"}


def add_sglang_admin_routes(app: web.Application) -> None:
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/health_generate", health_generate)
    for path, handler in (("/flush_cache", flush_cache), (RELEASE, release), (RESUME, resume)):
        app.router.add_get(path, handler)
        app.router.add_post(path, handler)
    app.router.add_post("/abort_request", abort_request)


async def model_info(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    base = gateway.served_models().base
    body = {
        "model_path": base,
        "tokenizer_path": base,
        "is_generation": not gateway.engine.classifier_labels,
        "preferred_sampling_params": None,
        "weight_version": "default",
    }
    return web.json_response(body)


async def health_generate(request: web.Request) -> web.Response:
    """SGLang's deep health check: the engine must answer a one-token request (a sleeping
    engine is not asked: the request would wait for its wake-up)."""
    engine = request.app[GATEWAY].engine
    if not engine.is_healthy or await engine.is_sleeping():
        return web.Response(status=503)
    events: Any = engine.generate([0], SamplingParams(max_tokens=1, temperature=0.0))
    async with contextlib.aclosing(events):  # leaving early aborts it
        first = await anext(events, None)
    return web.Response(status=200 if isinstance(first, Delta | Finished) else 503)


async def flush_cache(request: web.Request) -> web.Response:
    try:
        await request.app[GATEWAY].engine.reset_prefix_cache()
    except EngineStopped as exc:
        return engine_stopped(exc)
    return web.Response(text="Cache flushed.\n")


async def abort_request(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = decode_body(await read_json_body(request, gateway.settings), AbortBody)
    reason = "aborted by /abort_request"
    if body.abort_all:
        await gateway.engine.abort_all(reason)
    else:
        for engine_id in request.app[RIDS].engine_ids(body.rid):
            await gateway.engine.abort(engine_id, reason)
    return web.Response()


async def release(request: web.Request) -> web.Response:
    tags = (await _memory_body(request)).tags
    if tags is not None and not _ALL <= set(tags):
        raise invalid("tags", "the weights and the KV cache are released together: send both")
    try:
        reply = await request.app[GATEWAY].engine.sleep(1, mode="wait")
    except EngineStopped as exc:
        return engine_stopped(exc)
    return answer_sleep_call("sleep", reply)


async def resume(request: web.Request) -> web.Response:
    tags = (await _memory_body(request)).tags
    try:
        reply = await request.app[GATEWAY].engine.wake_up(tags)
    except EngineStopped as exc:
        return engine_stopped(exc)
    return answer_sleep_call("wake_up", reply)


async def _memory_body(request: web.Request) -> MemoryBody:
    """The body of a release or resume (a GET, or a POST without one, sends none)."""
    if not request.can_read_body:
        return MemoryBody()
    return decode_body(await read_json_body(request, request.app[GATEWAY].settings), MemoryBody)
