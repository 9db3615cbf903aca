"""What a web page may do with this server: its own pages anything, other sites nothing unless
listed in `allowed_origins`.

Browsers stamp `Origin` on websocket handshakes and on cross-site or non-GET fetches; tools
(curl, the OpenAI SDKs) send none. So on /v1/*:

- no Origin: not a page; served (the API key, if set, is the guard).
- Origin of this server (same host and port as the Host header): the playground; served.
- a listed Origin (or '*'): served, with CORS headers, and preflights answered.
- any other Origin: 403, the websocket included. Without this a page on any site could open
  the websocket of a server on localhost and, given `?api_key=` in a URL, spend its key.

POSTs must also be JSON (`http_body`), which browsers never send cross-site unasked.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable

from aiohttp import web
from troupe.gateway.errors import ApiError
from troupe.gateway.settings import GatewaySettings, canonical_origin
from troupe.gateway.state import GATEWAY

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_PREFLIGHT_MAX_AGE = "600"  # s a browser may cache a preflight answer


def is_same_origin(origin: str, host: str | None) -> bool:
    """`origin` names the host:port the request was sent to. A Host without a port takes the
    origin's default one, so a TLS proxy in front (https origin, plain Host) still matches."""
    canonical = canonical_origin(origin)
    if canonical is None or not host:
        return False
    scheme, _, _ = canonical.partition("://")
    served = canonical_origin(f"{scheme}://{host}")
    return served == canonical


def is_listed(origin: str, settings: GatewaySettings) -> bool:
    if "*" in settings.allowed_origins:
        return True
    canonical = canonical_origin(origin)
    return canonical is not None and any(
        canonical_origin(allowed) == canonical for allowed in settings.allowed_origins
    )


@web.middleware
async def browser_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """403 for pages of unlisted sites; answers CORS preflights for listed ones."""
    origin = request.headers.get("Origin")
    if origin is None or not request.path.startswith("/v1/"):
        return await handler(request)
    settings = request.app[GATEWAY].settings
    listed = is_listed(origin, settings)
    if not listed and not is_same_origin(origin, request.host):
        raise ApiError(
            403,
            f"pages from origin {_short(origin)} may not use this server; its operator can "
            "list the origin with --allowed-origins",
            param="Origin",
            code="origin_not_allowed",
        )
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": "Authorization, Content-Type",
                "Access-Control-Max-Age": _PREFLIGHT_MAX_AGE,
            },
        )
    return await handler(request)


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: a listed origin may read the answer (streams and errors too)."""
    origin = request.headers.get("Origin")
    if origin is None or not request.path.startswith("/v1/"):
        return
    if is_listed(origin, request.app[GATEWAY].settings):
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"


def _short(origin: str) -> str:
    return repr(urllib.parse.quote(origin[:100], safe=":/.[]"))
