"""An anyio blocking portal whose event loop runs in a daemon thread, for synchronous callers
of async code (troupe.LLM). anyio's own start_blocking_portal runs the loop in a worker thread
the interpreter waits for at exit, so a portal its owner forgot to close would hold the
process there; a daemon thread does not, and the owner's finalizer closes it at exit."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import anyio
from anyio.from_thread import BlockingPortal


@contextlib.contextmanager
def daemon_portal(backend: str) -> Iterator[BlockingPortal]:
    """A blocking portal on a `backend` (asyncio or trio) loop in a daemon thread; stopped,
    and the thread joined, on leaving."""
    started = threading.Event()
    portals: list[BlockingPortal] = []
    failures: list[BaseException] = []

    async def serve() -> None:
        async with BlockingPortal() as portal:
            portals.append(portal)
            started.set()
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(serve, backend=backend)
        except BaseException as exc:  # a bad backend name: raised in the caller's thread
            failures.append(exc)
            started.set()

    thread = threading.Thread(target=run, name="troupe-llm", daemon=True)
    thread.start()
    started.wait()
    if failures:
        raise failures[0]
    try:
        yield portals[0]
    finally:
        portals[0].call(portals[0].stop)
        thread.join()
