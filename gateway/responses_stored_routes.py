"""Stored responses over HTTP (OpenAI's Responses API; the store: gateway/responses_store.py).

    GET    /v1/responses/{response_id}              the response object (a running
                                                    background one's as of now: its status and
                                                    output so far; whole at its end);
                                                    ?stream=true&starting_after=N: its events
                                                    (gateway/responses_replay.py)
    POST   /v1/responses/{response_id}/cancel       a running background response cancelled:
                                                    the object, status "cancelled"
    DELETE /v1/responses/{response_id}              {"id", "object": "response", "deleted": true}
                                                    (a running one is cancelled first)
    GET    /v1/responses/{response_id}/input_items  a list: data, first_id, last_id, has_more;
                                                    ?order=asc|desc (desc when left out),
                                                    ?limit=1..100 (20), ?after=<item id>

An id the store does not hold (never stored, evicted, deleted, or no store at all) is a 404
naming it. Cancel, as vLLM and OpenAI answer it: a response not made with background is a
400 ("Cannot cancel a synchronous response."), one already cancelled answers its object again
(OpenAI: cancelling is idempotent), one that ended otherwise is a 400 naming its status.
"""

from __future__ import annotations

import msgspec
from aiohttp import web
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.responses_history import DEFAULT_PAGE, MAX_PAGE, Order, item_page
from troupe.gateway.responses_replay import replay_events, serve_events, starting_after
from troupe.gateway.responses_store import StoredResponse
from troupe.gateway.state import GATEWAY

_PATH = "/v1/responses/{response_id}"
_ORDERS: tuple[Order, ...] = ("asc", "desc")


class _Status(msgspec.Struct):
    """A stored object's status and background flag (its output left undecoded)."""

    status: str
    background: bool = False


_decode_status = msgspec.json.Decoder(_Status)
_json = msgspec.json.Encoder()


def add_stored_response_routes(app: web.Application) -> None:
    app.router.add_get(_PATH, retrieve)
    app.router.add_delete(_PATH, delete)
    app.router.add_post(f"{_PATH}/cancel", cancel)
    app.router.add_get(f"{_PATH}/input_items", input_items)


async def retrieve(request: web.Request) -> web.StreamResponse:
    entry = _stored(request)
    run = request.app[GATEWAY].background.get(entry.response_id)
    if request.query.get("stream", "false").lower() in ("false", "0"):
        body = entry.response if run is None else _json.encode(run.response_now())
        return web.Response(body=body, content_type="application/json")
    after = starting_after(request.query.get("starting_after"))
    stored = (
        [] if run is not None else replay_events(entry.stream_events(), after, entry.response_id)
    )
    return await serve_events(request, run, stored, after)


async def cancel(request: web.Request) -> web.Response:
    entry = _stored(request)
    if await request.app[GATEWAY].background.cancel(entry.response_id):
        entry = _stored(request)  # its end, as the run stored it
    status = _decode_status.decode(entry.response).status
    if not _decode_status.decode(entry.response).background:
        raise ApiError(400, "Cannot cancel a synchronous response.", param="response_id")
    if status not in ("cancelled", "queued", "in_progress"):
        raise ApiError(
            400,
            f"Cannot cancel a response that is {status} (only a queued or in_progress "
            "background response can be cancelled).",
            param="response_id",
        )
    return web.Response(body=entry.response, content_type="application/json")


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    gateway = request.app[GATEWAY]
    await gateway.background.cancel(response_id)
    store = gateway.responses
    if store is None or not store.delete(response_id):
        raise _not_found(request, response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


async def input_items(request: web.Request) -> web.Response:
    entry = _stored(request)
    text = request.query.get("order", "desc")
    if text not in _ORDERS:
        raise invalid("order", f"order must be asc or desc, got {text!r:.40}")
    order: Order = "asc" if text == "asc" else "desc"
    limit = _limit(request.query.get("limit"))
    page = item_page(
        entry.input_items(), order=order, limit=limit, after=request.query.get("after")
    )
    return web.json_response(page)


def _limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_PAGE
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE:
        raise invalid("limit", f"limit must be an integer from 1 to {MAX_PAGE}, got {text!r:.40}")
    return limit


def _stored(request: web.Request) -> StoredResponse:
    response_id = request.match_info["response_id"]
    store = request.app[GATEWAY].responses
    entry = store.get(response_id) if store is not None else None
    if entry is None:
        raise _not_found(request, response_id)
    return entry


def _not_found(request: web.Request, response_id: str) -> ApiError:
    why = ""
    if request.app[GATEWAY].responses is None:
        why = " (this server stores no responses: start it with --max-stored-responses N)"
    return ApiError(
        404,
        f"Response with id {response_id!r:.100} not found{why}.",
        param="response_id",
        code="response_not_found",
    )
