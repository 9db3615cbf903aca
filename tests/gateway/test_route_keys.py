"""Every route the server serves is behind the API key but for the few that must stay open
(the page and its files, the probes, the metrics scrape, the version): walked from the app's
own route table, so a route added later without the key fails here."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from troupe.gateway.app import build_app
from troupe.gateway.state import GatewaySettings

pytestmark = pytest.mark.anyio

KEYED = GatewaySettings(api_key="sesame")
OPEN = {"/", "/health", "/ping", "/version", "/metrics"}


def _routes(engine: Any) -> list[tuple[str, str]]:
    """(method, path) of every route, path parameters filled in."""
    app = build_app(engine, KEYED)
    found = []
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter") or info.get("prefix")
        if route.method == "HEAD" or path is None or path.startswith("/static"):
            continue
        found.append((route.method, re.sub(r"\{[^}]+\}", "x", path)))
    return sorted(set(found))


async def test_every_route_but_the_open_ones_needs_the_key(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(KEYED)
    routes = _routes(server.engine)
    assert ("POST", "/generate") in routes and ("POST", "/v1/completions") in routes
    unkeyed = []
    async with aiohttp.ClientSession() as http:
        for method, path in routes:
            kw: dict[str, Any] = {"json": {}} if method in ("POST", "PUT") else {}
            async with http.request(method, f"{url}{path}", **kw) as resp:
                if (resp.status == 401) == (path in OPEN):
                    unkeyed.append((method, path, resp.status))
    assert unkeyed == [], unkeyed
