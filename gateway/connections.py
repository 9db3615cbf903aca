"""The listening socket's gate: a cap on open connections, and a deadline for request heads.

aiohttp by itself lets a client hold a connection by sending its headers a byte at a time
(older versions never time out a connection that has not finished its first request head),
and takes any number of connections. `GatedSite` listens like `web.TCPSite`, but through a
`ConnectionGate`:

- past `max_connections` open connections, a new one is answered 503 and closed at once;
- a connection that has not delivered a complete request head `header_timeout` seconds after
  it opened is closed. Later heads on a kept-alive connection are bounded by aiohttp's
  keep-alive timeout (`keepalive_timeout`, set by `server.listen`).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import msgspec
import structlog
from aiohttp import web
from troupe.gateway.errors import ApiError
from troupe.gateway.settings import GatewaySettings

log = structlog.get_logger("troupe.gateway")

_REFUSAL_LINGER_SECONDS = 1.0  # a refused client's time to read its 503 before the close


class _Refusal(asyncio.Protocol):
    """Answers 503 to a connection over the cap, whatever the client sent, and closes it.

    Closing a socket with unread input resets it, and the reset may destroy the 503 before the
    client reads it: so the answer is followed by a FIN, input is discarded, and the socket is
    closed when the client closes its side or after `_REFUSAL_LINGER_SECONDS` at most."""

    def __init__(self) -> None:
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        error = ApiError(503, "too many open connections; retry later", code="overloaded")
        body = msgspec.json.encode(error.body())
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
        )
        transport.write(head.encode() + body)
        if transport.can_write_eof():
            transport.write_eof()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(_REFUSAL_LINGER_SECONDS, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # the request is not read: it is refused whatever it says

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


class ConnectionGate:
    """Protocol factory in front of aiohttp's `web.Server` (see the module docstring)."""

    def __init__(self, server: web.Server, settings: GatewaySettings) -> None:
        self._server = server
        self._max_connections = settings.max_connections
        self._header_timeout = settings.header_timeout
        # Handler -> its deadline, until its first request head or the deadline (handlers
        # take no weak references, so each entry lives at most `header_timeout` s).
        self._deadlines: dict[Any, asyncio.TimerHandle] = {}
        self.num_refused = 0
        self.num_timed_out = 0
        self._is_full = False
        # Handlers made whose connection aiohttp has not counted in `connections` yet: it
        # counts one in its connection_made, which the loop runs a hop or more after this
        # factory returns, and a burst of accepts may interleave with those hops. So a handler
        # is counted here from the factory until the server registers it, exactly.
        self._unregistered: set[Any] = set()
        make_request = server.request_factory
        register = server.connection_made

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            self._unregistered.discard(handler)
            register(handler, transport)

        def request_factory(message: Any, payload: Any, protocol: Any, *rest: Any) -> Any:
            # A request head has arrived on this connection: its deadline is met.
            deadline = self._deadlines.pop(protocol, None)
            if deadline is not None:
                deadline.cancel()
            return make_request(message, payload, protocol, *rest)

        # Handlers read the factory when they are built, so this takes effect for every
        # connection the gate lets in.
        server.request_factory = request_factory
        server.connection_made = connection_made  # type: ignore[method-assign]

    def __call__(self) -> asyncio.BaseProtocol:
        if len(self._server.connections) + len(self._unregistered) >= self._max_connections:
            self.num_refused += 1
            if not self._is_full:  # one line per episode, not one per refused connection
                self._is_full = True
                limit = self._max_connections
                log.warning("refusing connections: max_connections reached", limit=limit)
            return _Refusal()
        self._is_full = False
        handler = self._server()
        loop = asyncio.get_running_loop()
        self._unregistered.add(handler)
        self._deadlines[handler] = loop.call_later(self._header_timeout, self._expire, handler)
        return handler

    def _expire(self, handler: Any) -> None:
        self._unregistered.discard(handler)  # its transport never came up
        if self._deadlines.pop(handler, None) is None:
            return
        transport = handler.transport
        if transport is not None and not transport.is_closing():
            self.num_timed_out += 1
            log.debug("connection closed: no request head in time", seconds=self._header_timeout)
            transport.close()


class GatedSite(web.BaseSite):
    """`web.TCPSite` through a ConnectionGate."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        gate: ConnectionGate,
        ssl_context: ssl.SSLContext | None = None,
        ssl_handshake_timeout: float | None = None,
    ) -> None:
        """`ssl_context`: HTTPS (gateway/tls.py); the handshake must end within
        `ssl_handshake_timeout` s (the header timeout: a slow client is cut off before its
        first request head either way)."""
        super().__init__(runner)
        self._host = host
        self._port = port
        self._gate = gate
        self._ssl = ssl_context
        self._handshake_timeout = ssl_handshake_timeout

    @property
    def name(self) -> str:
        scheme = "http" if self._ssl is None else "https"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        handshake = self._handshake_timeout if self._ssl is not None else None
        self._server = await loop.create_server(
            self._gate,
            self._host,
            self._port,
            reuse_address=True,
            ssl=self._ssl,
            ssl_handshake_timeout=handshake,
        )
