"""A router (and stand-in replicas) on an asyncio loop in a background thread, for blocking tests.

`RouterThread(settings).start()` runs `serve_router` as `troupe router` does; `url`, and
`replicas` (the ReplicaSet) once ready. `add_app(app)` serves another aiohttp app on the same
loop (a replica that misbehaves on purpose) and returns its URL.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web
from troupe.gateway.router_app import serve_router
from troupe.gateway.router_replicas import ReplicaSet
from troupe.gateway.router_settings import RouterSettings


class LoopThread:
    """An asyncio loop in a daemon thread; `call(coro)` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._runners: list[web.AppRunner] = []

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def add_app(self, app: web.Application) -> str:
        async def start() -> str:
            runner = web.AppRunner(app, handler_cancellation=True)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self._runners.append(runner)
            host, port = runner.addresses[0][:2]
            return f"http://{host}:{port}"

        return str(self.call(start()))

    def close(self) -> None:
        async def stop() -> None:
            for runner in self._runners:
                await runner.cleanup()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class RouterThread(LoopThread):
    def __init__(self) -> None:
        super().__init__()
        self.url = ""
        self.replicas: ReplicaSet | None = None
        self._stop: asyncio.Event | None = None
        self._task: Any = None

    def start_router(self, settings: RouterSettings) -> RouterThread:
        ready = threading.Event()

        def on_ready(url: str, replicas: ReplicaSet) -> None:
            self.url, self.replicas = url, replicas
            ready.set()

        async def make_stop() -> asyncio.Event:
            return asyncio.Event()

        self._stop = self.call(make_stop())
        self._task = asyncio.run_coroutine_threadsafe(
            serve_router(
                settings, host="127.0.0.1", port=0, stop=self._stop, on_ready=on_ready,
                shutdown_grace=2.0,
            ),
            self.loop,
        )  # fmt: skip
        if not ready.wait(30):
            self._task.result(0)  # raises what stopped it, if anything
            raise TimeoutError("the router did not start in 30 s")
        return self

    def stats(self) -> list[dict[str, Any]]:
        assert self.replicas is not None
        return [
            {"url": r.url, "up": r.is_up, "routed": r.num_routed, "hits": r.num_prefix_hits,
             "failures": r.num_failures, "in_flight": r.num_in_flight}
            for r in self.replicas.replicas
        ]  # fmt: skip

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self._task.result(30)
        super().close()
