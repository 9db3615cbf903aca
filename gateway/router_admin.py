"""Managing the replicas' engines through the router (gateway/admin_routes.py on each):

    POST /reset_prefix_cache         sent to every replica that is up, all at once (each
    POST /update_weights_from_disk   engine owns its cache and weights); a replica that is
    POST /sleep, POST /wake_up       down counts as failed (503) and gets nothing (sleep mode:
    POST /flush_cache, /abort_request, the query string goes along); SGLang's admin calls
         /release_memory_occupation, (gateway/sglang_admin.py) alike
         /resume_memory_occupation
    POST /start_profile, /stop_profile each replica profiles its own engine, into its own
                                     --profiler-dir
    GET  /is_sleeping                {"is_sleeping": whether any up replica sleeps, "replicas":
                                     each one's answer by URL}

         all 200   {"success": true, "message": the first replica's, "replicas": N, and the
                   blocks dropped / requests paused summed over them}
         else      the first failure's status, {"success": false, "message"} naming each
                   replica (by URL) that succeeded and each that failed with what. An update
                   is not undone where it succeeded: the message says the replicas now serve
                   different weights, and the same call again brings the others along.

The router's prefix trees are left as they are: they approximate the replicas' caches, which
were emptied, and a stale tree only costs a routing choice.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from troupe.gateway.admin_routes import RESET_PATH, UPDATE_PATH
from troupe.gateway.profile_routes import PROFILE_PATHS
from troupe.gateway.router_answers import READ_ERRORS, ReplicaAnswer

# one fan-out for every call that all replicas must see (LoRA loads, these)
from troupe.gateway.router_loras import _post_everywhere
from troupe.gateway.router_proxy import ROUTER, SESSION
from troupe.gateway.sglang_admin import RELEASE, RESUME
from troupe.gateway.sleep_routes import IS_SLEEPING_PATH, SLEEP_PATH, WAKE_UP_PATH

_SUMMED = ("num_gpu_blocks_dropped", "num_cpu_blocks_dropped", "num_paused_requests")


def add_admin_routes(app: web.Application) -> None:
    app.router.add_post(RESET_PATH, fan_out)
    app.router.add_post(UPDATE_PATH, fan_out)
    app.router.add_post(SLEEP_PATH, fan_out)
    app.router.add_post(WAKE_UP_PATH, fan_out)
    app.router.add_get(IS_SLEEPING_PATH, is_sleeping)
    for path in ("/flush_cache", "/abort_request", RELEASE, RESUME):  # SGLang's
        app.router.add_post(path, fan_out)
    for path in PROFILE_PATHS:  # each replica writes its own trace
        app.router.add_post(path, fan_out)


async def fan_out(request: web.Request) -> web.Response:
    path = request.path
    answers = await _post_everywhere(request, request.path_qs, await request.read())
    bodies = [_body(a) for a in answers]
    if all(a.is_ok for a in answers):
        summed = {k: sum(int(b.get(k, 0)) for b in bodies) for k in _SUMMED if k in bodies[0]}
        message = f"{bodies[0].get('message', '')} (on each of {len(answers)} replicas)"
        if "is_sleeping" in bodies[0]:  # sleep mode: asleep where any replica sleeps
            summed["is_sleeping"] = any(bool(b.get("is_sleeping")) for b in bodies)
        return _answer(200, True, message, replicas=len(answers), **summed)
    failed = [(a, b) for a, b in zip(answers, bodies, strict=True) if not a.is_ok]
    what = "; ".join(f"{a.url} answered {a.status}: {_why(a, b)}" for a, b in failed)
    ok = [a.url for a in answers if a.is_ok]
    message = (
        f"{path} failed on {len(failed)} of {len(answers)} replicas: {what}; succeeded on "
        f"{', '.join(ok) or 'none'}"
    )
    if ok and path == UPDATE_PATH:
        message += " (those now serve the new weights, the others the old: call it again)"
    return _answer(failed[0][0].status, False, message, replicas=len(answers))


async def is_sleeping(request: web.Request) -> web.Response:
    """Each up replica's GET /is_sleeping; sleeping when any of them is."""
    replicas, session = request.app[ROUTER], request.app[SESSION]
    headers = {k: v for k, v in request.headers.items() if k == "Authorization"}

    async def ask(url: str) -> bool | None:
        try:
            async with session.get(f"{url}{IS_SLEEPING_PATH}", headers=headers) as resp:
                body = await resp.json() if resp.status == 200 else {}
        except (*READ_ERRORS, ValueError):
            return None
        value = body.get("is_sleeping") if isinstance(body, dict) else None
        return value if isinstance(value, bool) else None

    up = [r.url for r in replicas.replicas if r.is_up]
    answers = dict(zip(up, await asyncio.gather(*(ask(u) for u in up)), strict=True))
    return web.json_response({"is_sleeping": any(answers.values()), "replicas": answers})


def _body(answer: ReplicaAnswer) -> dict[str, Any]:
    try:
        body = json.loads(answer.body)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _why(answer: ReplicaAnswer, body: dict[str, Any]) -> str:
    """The replica's own words: SGLang's `message`, or an OpenAI error, or its text."""
    if isinstance(message := body.get("message"), str):
        return message
    return answer.describe().split(": ", 1)[-1]


def _answer(status: int, success: bool, message: str, **extra: int) -> web.Response:
    return web.json_response({"success": success, "message": message, **extra}, status=status)
