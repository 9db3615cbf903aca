"""What one gateway app holds: the engine, its settings, metrics, the drain state, and the
stored responses."""

from __future__ import annotations

import asyncio
import weakref

from aiohttp import web
from troupe.gateway.engine_api import EngineLike
from troupe.gateway.metrics import GatewayMetrics
from troupe.gateway.responses_background import BackgroundRuns
from troupe.gateway.responses_store import ResponseStore, new_home_id
from troupe.gateway.served_models import ServedModels
from troupe.gateway.settings import GatewaySettings


class Gateway:
    """Per-app state shared by the handlers (stored in the app under GATEWAY)."""

    def __init__(self, engine: EngineLike, settings: GatewaySettings) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = GatewayMetrics(engine, settings.served_model_name)
        engine.add_event_listener(self.metrics.on_event)
        self.is_draining = False
        self.num_streams = 0  # engine streams the handlers hold open
        self._idle = asyncio.Event()
        self._idle.set()
        self.websockets: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()
        # Stored /v1/responses answers (None: --max-stored-responses 0), and the id their ids
        # carry so the router finds them here (shown on /health)
        self.responses: ResponseStore | None = None
        if settings.max_stored_responses > 0:
            self.responses = ResponseStore(
                max_entries=settings.max_stored_responses,
                max_bytes=settings.max_stored_response_bytes,
            )
        self.home_id = new_home_id()
        # Background responses run here (ended, their requests aborted, on the app's shutdown)
        self.background = BackgroundRuns(self.responses)
        engine.add_event_listener(self.background.on_event)

    def served_models(self) -> ServedModels:
        """What a request's `model` may name now (the engine's adapters change at run time)."""
        return ServedModels.of(self.engine, self.settings.served_model_name)

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

__all__ = ["GATEWAY", "Gateway", "GatewaySettings"]
