"""What the replicas serve, through the router: run-time LoRA on every replica, and the models
every replica lists.

    POST /v1/load_lora_adapter     sent to every replica that is up, all at once (each engine
    POST /v1/unload_lora_adapter   owns its adapters); a replica that is down counts as failed
                                   (503) and gets nothing
         all 200   the first replica's answer (vLLM's plain-text "Success: ...")
         else      the first failure's status, an OpenAI error whose message names each
                   replica (by URL) that succeeded and each that failed with what (param and
                   code: that failure's own); a load that failed somewhere is unloaded again
                   from the replicas where it succeeded (best effort, said in the message) so
                   the replicas stay alike
    GET  /v1/models[/{model}]      the base model and the adapters that every up replica lists
                                   (in the first one's order): a client never picks an
                                   adapter some replica lacks

The router remembers each load that every replica answered 200, and forgets it on an unload
that some replica answered 200 (the ReplicaSet's `loras`, gateway/router_lora_ledger.py): a
replica that restarts, or comes up again after being down, gets the remembered loads before it
takes traffic, so /v1/models keeps listing them. A replica that was down during an unload (the
unload's error names it) and comes back without having restarted still holds that adapter;
/v1/models leaves it out (the others lack it): unload it there.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web
from troupe.gateway.errors import ApiError
from troupe.gateway.models_routes import card_named
from troupe.gateway.router_answers import READ_ERRORS, ReplicaAnswer, made_up
from troupe.gateway.router_lora_ledger import LOAD
from troupe.gateway.router_proxy import ROUTER, SESSION
from troupe.gateway.router_replicas import Replica, ReplicaSet

UNLOAD = "/v1/unload_lora_adapter"
_FORWARDED = ("Authorization", "Content-Type")


def add_lora_routes(app: web.Application) -> None:
    app.router.add_post(LOAD, load_lora_adapter)
    app.router.add_post(UNLOAD, unload_lora_adapter)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)


async def load_lora_adapter(request: web.Request) -> web.Response:
    body = await request.read()
    answers = await _post_everywhere(request, LOAD, body)
    if all(a.is_ok for a in answers):
        request.app[ROUTER].loras.remember(_lora_name(body), body, _headers(request))
        return _as_response(answers[0])
    ok = [a.url for a in answers if a.is_ok]
    note = await _unload_from(request, ok, _lora_name(body)) if ok else ""
    raise _partial_failure("load", body, answers, note)


async def unload_lora_adapter(request: web.Request) -> web.Response:
    body = await request.read()
    answers = await _post_everywhere(request, UNLOAD, body)
    if any(a.is_ok for a in answers):  # no longer on every replica: replayed to none
        request.app[ROUTER].loras.forget(_lora_name(body))
    if all(a.is_ok for a in answers):
        return _as_response(answers[0])
    raise _partial_failure("unload", body, answers, "")


async def models(request: web.Request) -> web.Response:
    """The models every up replica lists; a replica's refusal (e.g. a 401) as it answered."""
    listing = await _listing(request)
    return listing if isinstance(listing, web.Response) else web.json_response(listing)


async def model(request: web.Request) -> web.Response:
    """One of the models every up replica lists (OpenAI's retrieve), or a 404 naming it."""
    listing = await _listing(request)
    if isinstance(listing, web.Response):
        return listing
    return web.json_response(card_named(listing["data"], request.match_info["model"]))


async def _listing(request: web.Request) -> dict[str, Any] | web.Response:
    """/v1/models as every up replica lists it, or the refusal a replica answered with."""
    replicas, session = request.app[ROUTER], request.app[SESSION]
    headers = _headers(request)
    up = [r for r in replicas.replicas if r.is_up]
    got = await asyncio.gather(*(_get_models(replicas, session, r, headers) for r in up))
    answers = [a for a in got if a is not None]
    if not answers:
        raise ApiError(503, "no replica is up to answer /v1/models", code="no_replica_up")
    if (refused := next((a for a in answers if not a.is_ok), None)) is not None:
        return _as_response(refused)
    try:
        listings = [json.loads(a.body) for a in answers]
        ids = [{m["id"] for m in listing["data"]} for listing in listings]
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(502, f"a replica's /v1/models is malformed: {exc!r}") from exc
    common = set.intersection(*ids)
    first: dict[str, Any] = listings[0]
    return {**first, "data": [m for m in first["data"] if m["id"] in common]}


async def _post_everywhere(request: web.Request, path: str, body: bytes) -> list[ReplicaAnswer]:
    """`body` POSTed to `path` on every up replica at once; answers in replica order."""
    replicas, session = request.app[ROUTER], request.app[SESSION]
    headers = _headers(request)

    async def post(replica: Replica) -> ReplicaAnswer:
        if not replica.is_up:
            return made_up(replica.url, "is down: not sent")
        try:
            async with session.post(f"{replica.url}{path}", data=body, headers=headers) as resp:
                answer = ReplicaAnswer(
                    url=replica.url,
                    status=resp.status,
                    body=await resp.read(),
                    content_type=resp.content_type,
                )
        except READ_ERRORS as exc:
            replicas.fail(replica, f"{path} failed: {exc!r}")
            return made_up(replica.url, f"could not be reached: {exc!r}")
        if answer.status == 503:  # draining or failed: /health decides, as for a proxied one
            replicas.fail(replica, "answered 503", is_down=False)
            await replicas.check(session, replica)
        return answer

    return list(await asyncio.gather(*(post(r) for r in replicas.replicas)))


async def _unload_from(request: web.Request, urls: list[str], name: str) -> str:
    """Unload `name` from the replicas at `urls` (where a load succeeded); what happened."""
    body = json.dumps({"lora_name": name}).encode()
    session, headers = request.app[SESSION], _headers(request)

    async def unload(url: str) -> ReplicaAnswer:
        try:
            async with session.post(f"{url}{UNLOAD}", data=body, headers=headers) as resp:
                return ReplicaAnswer(
                    url=url, status=resp.status, body=await resp.read(), content_type=""
                )
        except READ_ERRORS as exc:
            return made_up(url, f"could not be reached: {exc!r}")

    answers = await asyncio.gather(*(unload(u) for u in urls))
    undone = [a.url for a in answers if a.is_ok]
    note = f"; unloaded it again from {', '.join(undone)}" if undone else ""
    if failures := [a.describe() for a in answers if not a.is_ok]:
        note += f"; could not unload it again ({'; '.join(failures)}): those replicas keep it"
    return note + " (best effort, so that the replicas serve the same adapters)"


def _partial_failure(verb: str, body: bytes, answers: list[ReplicaAnswer], note: str) -> ApiError:
    failed = [a for a in answers if not a.is_ok]
    first = failed[0]
    _, param, code = first.error()
    what = "; ".join(a.describe() for a in failed)
    ok = [a.url for a in answers if a.is_ok]
    name = _lora_name(body)
    message = (
        f"{verb} of LoRA adapter {name!r} failed on {len(failed)} of {len(answers)} "
        f"replicas: {what}; succeeded on {', '.join(ok) or 'none'}{note}"
    )
    return ApiError(first.status, message, param=param, code=code or "replica_failed")


def _lora_name(body: bytes) -> str:
    try:
        return str(json.loads(body)["lora_name"])
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested too deep
        return "?"  # a malformed body: every replica refuses it, naming the field


async def _get_models(
    replicas: ReplicaSet,
    session: aiohttp.ClientSession,
    replica: Replica,
    headers: dict[str, str],
) -> ReplicaAnswer | None:
    """The replica's /v1/models answer, or None (and the replica marked down) if it fails."""
    try:
        async with session.get(f"{replica.url}/v1/models", headers=headers) as resp:
            return ReplicaAnswer(
                url=replica.url,
                status=resp.status,
                body=await resp.read(),
                content_type=resp.content_type,
            )
    except READ_ERRORS as exc:
        replicas.fail(replica, f"/v1/models failed: {exc!r}")
        return None


def _headers(request: web.Request) -> dict[str, str]:
    return {k: v for k in _FORWARDED if (v := request.headers.get(k)) is not None}


def _as_response(answer: ReplicaAnswer) -> web.Response:
    return web.Response(status=answer.status, body=answer.body, content_type=answer.content_type)
