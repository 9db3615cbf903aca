"""The torch profiler over HTTP, vLLM's and SGLang's routes (Engine.start_profile /
stop_profile; the trace goes into the engine's --profiler-dir). Behind the API key.

    POST /start_profile   optional JSON {"record_shapes": bool, "with_stack": bool}: 200
                          {"success": true, "message"}; 400 (profiling off: no
                          --profiler-dir; disaggregation; a field troupe does not take, named),
                          409 (a profile is running), 500 (the profiler failed), 503 (engine
                          stopped)
    POST /stop_profile    200 {"success": true, "message", "trace_path"}: the Chrome trace
                          of the executor's steps since the start; 409 (none running)

SGLang's `output_dir` and `num_steps` are 400s naming them: the server writes only into its
own folder, and a profile ends with /stop_profile.
"""

from __future__ import annotations

import msgspec
from aiohttp import web
from troupe.actors.engine_stopped import EngineStopped
from troupe.gateway.errors import invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.openai_bodies import decode_body
from troupe.gateway.sleep_routes import engine_stopped
from troupe.gateway.state import GATEWAY
from troupe.messages.profile_calls import ProfileErrorCode, ProfileReply

START_PATH, STOP_PATH = "/start_profile", "/stop_profile"
PROFILE_PATHS = (START_PATH, STOP_PATH)
_STATUS = {
    ProfileErrorCode.RUNNING: 409,
    ProfileErrorCode.NOT_RUNNING: 409,
    ProfileErrorCode.FAILED: 500,
}  # the rest: 400


class StartBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    record_shapes: bool = False
    with_stack: bool = False
    # SGLang's, refused by name
    output_dir: str | None = None
    num_steps: int | None = None


def add_profile_routes(app: web.Application) -> None:
    app.router.add_post(START_PATH, start_profile)
    app.router.add_post(STOP_PATH, stop_profile)


async def start_profile(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = StartBody()  # no body at all: the defaults (vLLM's clients send none)
    if request.body_exists:
        body = decode_body(await read_json_body(request, gateway.settings), StartBody)
    if body.output_dir is not None:
        raise invalid("output_dir", "output_dir: the traces go into the server's --profiler-dir")
    if body.num_steps is not None:
        raise invalid("num_steps", "num_steps: a profile runs until POST /stop_profile")
    try:
        reply = await gateway.engine.start_profile(
            record_shapes=body.record_shapes, with_stack=body.with_stack
        )
    except EngineStopped as exc:
        return engine_stopped(exc)
    return _answer(reply)


async def stop_profile(request: web.Request) -> web.Response:
    try:
        reply = await request.app[GATEWAY].engine.stop_profile()
    except EngineStopped as exc:
        return engine_stopped(exc)
    return _answer(reply)


def _answer(reply: ProfileReply) -> web.Response:
    body: dict[str, object] = {"success": reply.error is None, "message": reply.message}
    if reply.trace_path is not None:
        body["trace_path"] = reply.trace_path
    if reply.error is not None:
        body["code"] = str(reply.error)
        return web.json_response(body, status=_STATUS.get(reply.error, 400))
    return web.json_response(body)
