"""Managing a running engine (actors/engine_admin.py), in the shapes vLLM's and SGLang's
clients call. Behind the API key like /v1/*.

    POST /reset_prefix_cache         (vLLM) drop every cached prefix block no request holds,
                                     GPU and CPU tiers; running requests go on. 200:
                                     {"success": true, "message", "num_gpu_blocks_dropped",
                                     "num_cpu_blocks_dropped"}
    POST /update_weights_from_disk   (SGLang) {"model_path", "load_format"?, "abort_all_requests"?,
                                     "flush_cache"?}: only with GatewaySettings.
                                     allow_runtime_weight_updating (else 404). Copies the
                                     checkpoint into the served weights in place and resets the
                                     prefix cache; waits for the requests in flight (they end
                                     on the old weights; newer ones wait), or aborts them first
                                     with abort_all_requests. SGLang's answer: {"success",
                                     "message", "num_paused_requests"}; 200, or 400 (not the
                                     served model's shapes, unreadable, unsupported: nothing
                                     changed), 409 (another update runs), 503 (engine stopped)
"""

from __future__ import annotations

import msgspec
import structlog
from aiohttp import web
from troupe.actors.engine_stopped import EngineStopped
from troupe.gateway.http_body import read_json_body
from troupe.gateway.openai_bodies import decode_body
from troupe.gateway.sleep_routes import SLEEP_PATHS, add_sleep_routes
from troupe.gateway.state import GATEWAY
from troupe.messages.engine_calls import WeightsErrorCode

log = structlog.get_logger("troupe.gateway")

RESET_PATH, UPDATE_PATH = "/reset_prefix_cache", "/update_weights_from_disk"
ADMIN_PATHS = (RESET_PATH, UPDATE_PATH, *SLEEP_PATHS)  # sleep mode: gateway/sleep_routes.py
_STATUS = {WeightsErrorCode.BUSY: 409}  # the rest: 400


class UpdateBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True  # SGLang's; the cache's KV came from the old weights: always


def add_admin_routes(app: web.Application) -> None:
    """The reset and sleep mode's routes always; the update when the settings allow run-time
    weight updates."""
    app.router.add_post(RESET_PATH, reset_prefix_cache)
    add_sleep_routes(app)
    if app[GATEWAY].settings.allow_runtime_weight_updating:
        app.router.add_post(UPDATE_PATH, update_weights_from_disk)


async def reset_prefix_cache(request: web.Request) -> web.Response:
    engine = request.app[GATEWAY].engine
    try:
        reply = await engine.reset_prefix_cache()
    except EngineStopped as exc:
        return _answer(503, False, f"the engine is not serving: {exc}")
    gpu, cpu = reply.dropped.num_gpu_blocks, reply.dropped.num_cpu_blocks
    message = f"dropped {gpu} cached GPU blocks and {cpu} CPU blocks of the prefix cache"
    log.info("prefix cache reset", num_gpu_blocks=gpu, num_cpu_blocks=cpu)
    return _answer(200, True, message, num_gpu_blocks_dropped=gpu, num_cpu_blocks_dropped=cpu)


async def update_weights_from_disk(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = decode_body(await read_json_body(request, gateway.settings), UpdateBody)
    if not body.flush_cache:
        message = (
            "flush_cache false is not supported: the prefix cache's KV was computed with the "
            "old weights, so an update always resets it"
        )
        return _answer(400, False, message, num_paused_requests=0)
    try:
        reply = await gateway.engine.update_weights_from_disk(
            body.model_path, body.load_format, abort_all_requests=body.abort_all_requests
        )
    except EngineStopped as exc:
        return _answer(503, False, f"the engine is not serving: {exc}", num_paused_requests=0)
    status = 200 if reply.error is None else _STATUS.get(reply.error, 400)
    log.info("update_weights_from_disk", model_path=body.model_path, success=reply.success,
             message=reply.message)  # fmt: skip
    return _answer(
        status, reply.success, reply.message, num_paused_requests=reply.num_paused_requests
    )


def _answer(status: int, success: bool, message: str, **extra: int) -> web.Response:
    return web.json_response({"success": success, "message": message, **extra}, status=status)
