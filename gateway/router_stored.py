"""The router's routes to stored responses (OpenAI's Responses API; the store itself:
gateway/responses_store.py): each goes to the replica whose home id the response id carries.

    GET    /v1/responses/{response_id}              proxied to the replica holding it
    DELETE /v1/responses/{response_id}              (gateway/router_proxy.proxy_to_holder):
    GET    /v1/responses/{response_id}/input_items  a 503 naming it when it is down
    POST   /v1/responses/{response_id}/cancel       (a background response runs there)

GET ?stream=true (a background response's events) is piped as a Responses stream: one that
stops before its end event (completed, incomplete, or `error` for failed and cancelled) gets
the router's `error` event.

An id no replica's home is in (made by a replica since restarted, or not troupe's) is the
router's own 404, in the shape a replica gives. `previous_response_id` on a create is read by
`previous_response`, the /v1/responses endpoint's `stored` (gateway/router_app.py).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from troupe.gateway.errors import ApiError
from troupe.gateway.router_proxy import ROUTER, proxy_to_holder
from troupe.gateway.router_streams import RESPONSES_EVENTS

_PATH = "/v1/responses/{response_id}"


def add_stored_routes(app: web.Application) -> None:
    app.router.add_get(_PATH, stored_response)
    app.router.add_delete(_PATH, stored_response)
    app.router.add_get(f"{_PATH}/input_items", stored_response)
    app.router.add_post(f"{_PATH}/cancel", stored_response)


def previous_response(body: dict[str, Any]) -> str | None:
    """The stored response a /v1/responses body continues."""
    response_id = body.get("previous_response_id")
    return response_id if isinstance(response_id, str) else None


async def stored_response(request: web.Request) -> web.StreamResponse:
    response_id = request.match_info["response_id"]
    holder = request.app[ROUTER].holder_of(response_id)
    if holder is None:
        raise ApiError(
            404,
            f"Response with id {response_id!r:.100} not found (no replica's home id is in it: "
            "its replica may have restarted since).",
            param="response_id",
            code="response_not_found",
        )
    body = await request.read()
    return await proxy_to_holder(request, response_id, holder, body, RESPONSES_EVENTS)
