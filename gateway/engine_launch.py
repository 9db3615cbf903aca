"""Start the engine process of `troupe serve` and stop it: `open_remote_engine`.

The child is started from troupe's fork server (child_processes.py; never forked from this
process itself: the server runs threads, maybe CUDA) with one end of a Unix socketpair; the
server keeps the other, wrapped in a RemoteEngine. The server closes its copy of
the child's end at once, so the child's exit is the server's end of file, and the server's
exit (even by SIGKILL) the child's. Stopping: Shutdown, then the process is reaped (killed if it
does not stop in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import structlog
from troupe.child_processes import child_context
from troupe.config import EngineConfig
from troupe.gateway.engine_api import TokenizerLike
from troupe.gateway.remote_engine import DIED, RemoteEngine
from troupe.messages.engine_protocol import Shutdown

if TYPE_CHECKING:
    from troupe.gateway.engine_process import RunnerFactory

log = structlog.get_logger("troupe.gateway")

_ENGINE_GRACE = 5.0  # s the engine gives what is left at shutdown (as Engine.aclose)
_STOP_SECONDS = 30.0  # then for the process to stop (closing the runner) before it is killed


@asynccontextmanager
async def open_remote_engine(
    config: EngineConfig, *, runner_factory: RunnerFactory | None = None
) -> AsyncIterator[RemoteEngine]:
    """Start the engine in a child process; on exit stop it and wait for it.

    Start-up errors leave as the in-process engine raises them (ConfigError, ModelLoadError);
    an engine that failed makes the exit raise EngineStopped, as Engine.open does.
    `runner_factory(config)`: build the child's runner with this (picklable) function."""
    from troupe.actors.engine_stopped import EngineStopped
    from troupe.gateway.engine_process import run_engine_process

    context = child_context()
    parent_sock, child_sock = socket.socketpair()
    process = context.Process(
        target=run_engine_process, args=(child_sock, config, runner_factory), name="troupe-engine"
    )
    try:
        await asyncio.to_thread(process.start)
    except BaseException:
        parent_sock.close()
        raise
    finally:
        child_sock.close()  # the child's copy alone keeps its end open: its exit is our EOF
    log.info("engine process started", pid=process.pid)
    engine = RemoteEngine(config.max_stream_buffer)
    try:
        await asyncio.get_running_loop().create_unix_connection(lambda: engine, sock=parent_sock)
        await engine.wait_started(lambda: _load_tokenizer(config))
        yield engine
    finally:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_STOP_SECONDS):
                await engine.shutdown(Shutdown(grace=_ENGINE_GRACE))
        engine.close_transport()
        exitcode = await asyncio.to_thread(_reap, process)
        log.debug("engine process exited", pid=process.pid, exitcode=exitcode)
    if engine.failure is not None:
        if engine.failure == DIED:
            raise EngineStopped(f"{DIED} (exit code {exitcode})")
        raise EngineStopped(engine.failure)


def _reap(process: multiprocessing.process.BaseProcess) -> int | None:
    """The exit status, once the process is gone (killed if it does not stop in time)."""
    process.join(_STOP_SECONDS)
    if process.exitcode is None:
        log.error("the engine process did not stop; killing it", pid=process.pid)
        process.kill()
        process.join()
    return process.exitcode


def _load_tokenizer(config: EngineConfig) -> TokenizerLike:
    from troupe.actors.core.tokenizer_files import load_tokenizer
    from troupe.config import resolve_model_path

    path = resolve_model_path(config.model)
    return load_tokenizer(path, config.chat_template, config.template_defaults_json)
