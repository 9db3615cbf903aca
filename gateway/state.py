"""What one gateway app holds: the engine, its settings, metrics, and the drain state."""

from __future__ import annotations

import asyncio
import dataclasses
import weakref

from aiohttp import web
from troupe.gateway.engine_api import EngineLike
from troupe.gateway.metrics import GatewayMetrics


@dataclasses.dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """Gateway knobs (the engine's are in EngineConfig)."""

    api_key: str | None = None  # when set, /v1/* needs `Authorization: Bearer <key>`
    max_body_bytes: int = 4 * 1024 * 1024  # larger request bodies get 413
    max_buffered_frames: int = 2048  # per connection: unread frames before a reader is cut off
    max_buffered_bytes: int = 8 * 1024 * 1024  # per connection, same
    slow_client_grace: float = 5.0  # s a cut-off client gets to take its error before we drop it
    ws_max_requests: int = 256  # requests in flight on one websocket
    ws_heartbeat: float | None = 30.0  # s between pings; dead peers are noticed and aborted

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_buffered_frames",
            "max_buffered_bytes",
            "ws_max_requests",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.slow_client_grace <= 0:
            raise ValueError(f"slow_client_grace must be > 0, got {self.slow_client_grace}")


class Gateway:
    """Per-app state shared by the handlers (stored in the app under GATEWAY)."""

    def __init__(self, engine: EngineLike, settings: GatewaySettings) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = GatewayMetrics(engine)
        engine.add_event_listener(self.metrics.on_event)
        self.is_draining = False
        self.num_streams = 0  # engine streams the handlers hold open
        self._idle = asyncio.Event()
        self._idle.set()
        self.websockets: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()

    def stream_opened(self) -> None:
        self.num_streams += 1
        self._idle.clear()

    def stream_closed(self) -> None:
        self.num_streams -= 1
        if self.num_streams == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Until no handler holds an engine stream."""
        await self._idle.wait()


GATEWAY = web.AppKey("gateway", Gateway)
