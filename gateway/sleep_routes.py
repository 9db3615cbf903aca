"""Sleep mode over HTTP, vLLM's routes (served in vLLM's dev mode; here always, answered by the
engine, which refuses with 400 naming --enable-sleep-mode when it is off). Behind the API key.

    POST /sleep?level=1[&mode=refuse|wait|abort]   Engine.sleep: 200 {"success": true,
                                  "message", "is_sleeping", "level", "num_paused_requests"};
                                  400 (a bad level or mode, sleep mode off, a runner without
                                  it), 409 (requests live with mode refuse, naming them; another
                                  sleep, wake_up or weight update under way), 500 (failed
                                  midway), 503 (engine stopped)
    POST /wake_up[?tags=weights&tags=kv_cache]     Engine.wake_up: the same answers
    GET  /is_sleeping                              {"is_sleeping": bool}

/health stays 200 while the engine sleeps; requests sent meanwhile wait for the wake_up.
"""

from __future__ import annotations

import structlog
from aiohttp import web
from troupe.actors.engine_stopped import EngineStopped
from troupe.gateway.errors import ApiError
from troupe.gateway.state import GATEWAY
from troupe.messages.sleep_calls import (
    SLEEP_LEVELS,
    SLEEP_MODES,
    SleepErrorCode,
    SleepMode,
    SleepReply,
)

log = structlog.get_logger("troupe.gateway")

SLEEP_PATH, WAKE_UP_PATH, IS_SLEEPING_PATH = "/sleep", "/wake_up", "/is_sleeping"
SLEEP_PATHS = (SLEEP_PATH, WAKE_UP_PATH, IS_SLEEPING_PATH)
STATUS = {
    SleepErrorCode.BUSY: 409,
    SleepErrorCode.RUNNING: 409,
    SleepErrorCode.FAILED: 500,
}  # the rest: 400


def add_sleep_routes(app: web.Application) -> None:
    app.router.add_post(SLEEP_PATH, sleep)
    app.router.add_post(WAKE_UP_PATH, wake_up)
    app.router.add_get(IS_SLEEPING_PATH, is_sleeping)


async def sleep(request: web.Request) -> web.Response:
    raw_level = request.query.get("level", "1")
    try:
        level = int(raw_level)
    except ValueError:
        level = 0
    if level not in SLEEP_LEVELS:  # checked here too: a huge int cannot reach the engine child
        message = f"level must be 1 or 2, got {raw_level!r:.40}"
        raise ApiError(400, message, param="level", code=str(SleepErrorCode.INVALID))
    mode = request.query.get("mode", "refuse")
    if mode not in SLEEP_MODES:
        raise ApiError(400, f"mode must be one of {', '.join(SLEEP_MODES)}", param="mode")
    engine = request.app[GATEWAY].engine
    mode_: SleepMode = mode  # checked just above
    try:
        reply = await engine.sleep(level, mode=mode_)
    except EngineStopped as exc:
        return engine_stopped(exc)
    return answer_sleep_call("sleep", reply)


async def wake_up(request: web.Request) -> web.Response:
    tags = request.query.getall("tags", [])
    try:
        reply = await request.app[GATEWAY].engine.wake_up(tags or None)
    except EngineStopped as exc:
        return engine_stopped(exc)
    return answer_sleep_call("wake_up", reply)


async def is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": await request.app[GATEWAY].engine.is_sleeping()})


def answer_sleep_call(call: str, reply: SleepReply) -> web.Response:
    status = 200 if reply.error is None else STATUS.get(reply.error, 400)
    log.info(call, success=reply.success, message=reply.message)
    body = {
        "success": reply.success,
        "message": reply.message,
        "is_sleeping": reply.is_sleeping,
        "level": reply.level,
        "num_paused_requests": reply.num_paused_requests,
    }
    if reply.error is not None:
        body["code"] = str(reply.error)
    return web.json_response(body, status=status)


def engine_stopped(exc: EngineStopped) -> web.Response:
    body = {"success": False, "message": f"the engine is not serving: {exc}"}
    return web.json_response(body, status=503)
