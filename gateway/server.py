"""`troupe serve`: run an Engine behind the gateway until SIGINT/SIGTERM, then drain.

The engine runs in a child process (gateway/engine_launch.py, gateway/remote_engine.py)
unless `GatewaySettings.engine_process` is off or a runner is injected: then in this one.

Shutdown: stop taking work (503, /health says draining), give in-flight requests
`--shutdown-grace` seconds to finish, abort the rest (each gets its terminal event: an SSE
error, a websocket `done` with finish_reason "abort"), close websockets, exit 0. If the engine
fails instead (an actor crashed, or the executor hung past step_timeout_s), /health answers
503 and the process exits 1 so that a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import WSCloseCode, web
from troupe.actors.heap_freeze import frozen_heap
from troupe.config import ConfigError, EngineConfig
from troupe.gateway.app import build_app
from troupe.gateway.connections import ConnectionGate, GatedSite
from troupe.gateway.engine_api import EngineLike
from troupe.gateway.settings import add_settings_arguments, settings_from_args
from troupe.gateway.state import GATEWAY, GatewaySettings
from troupe.gateway.tls import server_ssl_context

if TYPE_CHECKING:
    from troupe.gateway.engine_process import RunnerFactory
    from troupe.gpu.runner import Runner

log = structlog.get_logger("troupe.gateway")

_FLUSH_SECONDS = 5.0  # after aborting: time for handlers to write the terminal events


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Server flags of `troupe serve`: where to listen, the drain grace, and one flag per
    GatewaySettings field (the CLI adds the EngineConfig flags)."""
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    group.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free one")
    group.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish after SIGINT/SIGTERM (default 30)",
    )
    add_settings_arguments(parser)


def run_serve(args: argparse.Namespace, config: EngineConfig) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status (0 after a clean drain)."""
    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"troupe serve: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        stop, force = asyncio.Event(), asyncio.Event()

        def on_signal() -> None:
            # The first signal drains; a second one cuts the grace period short.
            (force if stop.is_set() else stop).set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        await serve(
            config,
            settings,
            host=args.host,
            port=args.port,
            shutdown_grace=args.shutdown_grace,
            stop=stop,
            force=force,
        )

    from troupe.actors.engine_stopped import EngineStopped

    try:
        asyncio.run(main())
    except EngineStopped as exc:  # a supervisor should restart us: say why, exit non-zero
        log.error("engine failed; exiting", error=str(exc))
        return 1
    except ValueError as exc:
        if not is_start_error(exc):
            raise
        print(f"troupe serve: {exc}", file=sys.stderr)  # a bad model or setting: no traceback
        return 1
    return 0


def is_start_error(exc: BaseException) -> bool:
    """A model or setting the engine refused at start (the same in both engine placements)."""
    from troupe.actors.core.tokenizer_files import TokenizerLoadError
    from troupe.gpu.model_config import ModelLoadError

    return isinstance(exc, ConfigError | ModelLoadError | TokenizerLoadError)


async def serve(
    config: EngineConfig,
    settings: GatewaySettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    shutdown_grace: float = 30.0,
    stop: asyncio.Event,
    force: asyncio.Event | None = None,
    on_ready: Callable[[str, web.Application], None] | None = None,
    runner: Runner | None = None,
    runner_factory: RunnerFactory | None = None,
) -> None:
    """Start the engine and the HTTP server; when `stop` is set, drain and return.

    `force`, set while draining, aborts in-flight requests at once. `on_ready(url, app)` is
    called once the socket listens (the app holds the engine). `runner`: drive this one instead
    of the config's, in this process; `runner_factory`: build the engine process's runner with
    it (both for fault injection). If the engine fails, serving stops at once and
    EngineStopped leaves this function."""
    async with open_engine(config, settings, runner, runner_factory) as engine:
        app = build_app(engine, settings)
        app_runner = await listen(app, settings, host, port)
        try:
            bound_host, bound_port = app_runner.addresses[0][:2]
            scheme = "http" if settings.ssl_certfile is None else "https"
            url = f"{scheme}://{_url_host(bound_host)}:{bound_port}"
            model = app[GATEWAY].served_models().model_id
            log.info("serving", url=url, model=model, playground=f"{url}/")
            if on_ready is not None:
                on_ready(url, app)
            # The gateway's start-up heap (torch's modules, the tokenizer) kept out of the
            # collector's walks too, not only the engine's (actors/heap_freeze.py): the
            # allocations of a burst of requests trigger full collections, each a pause of
            # every stream this process serves (a 300-request burst's arrivals: docs/benchmarks.md)
            with frozen_heap(config.gc_freeze):
                await _first_of(stop.wait(), engine.wait_stopped())
                if engine.is_healthy:
                    await drain(app, engine, shutdown_grace, force)
        finally:
            await app_runner.cleanup()
    log.info("stopped")


def open_engine(
    config: EngineConfig,
    settings: GatewaySettings,
    runner: Runner | None = None,
    runner_factory: RunnerFactory | None = None,
) -> AbstractAsyncContextManager[EngineLike]:
    """The engine in a child process (settings.engine_process, without an injected runner),
    or in this one."""
    if settings.engine_process and runner is None:
        from troupe.gateway.engine_launch import open_remote_engine

        return open_remote_engine(config, runner_factory=runner_factory)
    from troupe.actors.engine import Engine  # the engine pulls in torch: import on use

    if runner is None and runner_factory is not None:
        runner = runner_factory(config)
    return Engine.open(config, runner=runner)


async def listen(
    app: web.Application, settings: GatewaySettings, host: str, port: int
) -> web.AppRunner:
    """Serve `app` on host:port through the connection gate; `cleanup()` the runner to stop."""
    app_runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=_FLUSH_SECONDS,
        # Closes a kept-alive connection idle (or trickling its next request head) this long;
        # the gate bounds the first head of a connection (header_timeout).
        keepalive_timeout=settings.keepalive_timeout,
    )
    await app_runner.setup()
    try:
        assert app_runner.server is not None  # set by setup()
        gate = ConnectionGate(app_runner.server, settings)
        tls = server_ssl_context(settings)  # None: plain HTTP
        site = GatedSite(app_runner, host, port, gate, tls, settings.header_timeout)
        await site.start()
    except BaseException:
        await app_runner.cleanup()
        raise
    return app_runner


async def drain(
    app: web.Application, engine: EngineLike, grace: float, force: asyncio.Event | None = None
) -> None:
    """503 for new work; wait up to `grace` s (or until `force`) for in-flight requests;
    abort the rest."""
    gateway = app[GATEWAY]
    gateway.is_draining = True
    log.info("draining", in_flight=gateway.num_streams, grace_s=grace)
    waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(gateway.wait_idle())]
    if force is not None:
        waiters.append(asyncio.ensure_future(force.wait()))
    try:
        await asyncio.wait(waiters, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    if gateway.num_streams:
        log.info("aborting requests past the shutdown deadline", count=gateway.num_streams)
        await engine.abort_all("server shutting down")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_FLUSH_SECONDS):
                await gateway.wait_idle()
    for ws in list(gateway.websockets):
        if not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")


async def _first_of(*waits: Awaitable[object]) -> None:
    """Until the first of `waits` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
