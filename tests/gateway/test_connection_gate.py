"""The connection cap counts a connection once, from its protocol factory to its close.

The end-to-end test of the cap (test_security.py) cannot pick the order in which the loop runs
a second accept against the first connection's registration; this one drives the gate through
that order by hand: a connection that aiohttp has registered must not also count as pending."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from troupe.gateway.connections import ConnectionGate, _Refusal
from troupe.gateway.state import GatewaySettings

pytestmark = pytest.mark.anyio


class _Transport(asyncio.Transport):
    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


async def _handler(request: web.Request) -> web.Response:
    return web.Response()


async def test_a_registered_connection_counts_once() -> None:
    server = web.Server(_handler)
    gate = ConnectionGate(server, GatewaySettings(max_connections=2))
    first: Any = gate()
    server.connection_made(first, _Transport())  # what the handler's connection_made calls
    # The second accept runs before any later loop hop: the first must count once, not twice.
    second: Any = gate()
    assert not isinstance(second, _Refusal)
    assert isinstance(gate(), _Refusal)  # two made (one registered, one pending): full
    server.connection_made(second, _Transport())
    assert isinstance(gate(), _Refusal)
    server.connection_lost(first, None)
    assert not isinstance(gate(), _Refusal)  # a slot came back
    assert gate.num_refused == 2
    await server.shutdown(0)
