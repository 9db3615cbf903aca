"""Stored responses over HTTP (OpenAI's Responses API; the store: gateway/responses_store.py).

    GET    /v1/responses/{response_id}              the response object, as created
    DELETE /v1/responses/{response_id}              {"id", "object": "response", "deleted": true}
    GET    /v1/responses/{response_id}/input_items  a list: data, first_id, last_id, has_more;
                                                    ?order=asc|desc (desc when left out),
                                                    ?limit=1..100 (20), ?after=<item id>

An id the store does not hold (never stored, evicted, deleted, or no store at all) is a 404
naming it. GET with `stream=true` (OpenAI's replay of a background response's events) is a
400: troupe has no background responses to replay.
"""

from __future__ import annotations

from aiohttp import web
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.responses_history import DEFAULT_PAGE, MAX_PAGE, Order, item_page
from troupe.gateway.responses_store import StoredResponse
from troupe.gateway.state import GATEWAY

_PATH = "/v1/responses/{response_id}"
_ORDERS: tuple[Order, ...] = ("asc", "desc")


def add_stored_response_routes(app: web.Application) -> None:
    app.router.add_get(_PATH, retrieve)
    app.router.add_delete(_PATH, delete)
    app.router.add_get(f"{_PATH}/input_items", input_items)


async def retrieve(request: web.Request) -> web.Response:
    if request.query.get("stream", "false").lower() not in ("false", "0"):
        raise invalid("stream", "stream is not supported here: troupe has no background "
                      "responses to replay; GET answers the stored response whole")  # fmt: skip
    entry = _stored(request)
    return web.Response(body=entry.response, content_type="application/json")


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    store = request.app[GATEWAY].responses
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
