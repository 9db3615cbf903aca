"""The engine child of `troupe serve`: an Engine (every actor and the runner) in a process of
its own, driven over one socket by the gateway's RemoteEngine (messages/engine_protocol.py).

Why a process: in one interpreter the gateway's per-token work (SSE and JSON formatting,
socket writes) takes the interpreter lock from the actors and the runner's thread.

Life: start the engine, send Hello (or StartFailed, exit 1); then apply commands in the order
they come (Generate -> Engine.submit, Abort, AbortAll: an Abort never overtakes its Generate;
LoadLora, UnloadLora, ResetCache and UpdateWeightsFromDisk run as tasks of their own,
answered by call id) and forward events (gateway/event_forwarder.py); stop on Shutdown, when the socket closes (the
gateway is gone: no orphan is left, even with a runner stuck in a step, which
gateway/orphan_exit.py ends hard past orphan_stop_timeout_s), or when the engine fails. The
last frame is Stopped; the exit status is 0 after a clean stop, 1 otherwise, ORPHAN_EXIT_CODE
(3) for the hard end. SIGINT and SIGTERM are ignored: a Ctrl-C (or a supervisor's SIGTERM)
sent to the process group reaches the gateway too, which drains and then sends Shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from troupe.config import ConfigError, EngineConfig
from troupe.gateway.event_forwarder import EventForwarder
from troupe.gateway.orphan_exit import arm_orphan_exit
from troupe.messages import ChatPrompt, GenerateRequest
from troupe.messages.engine_calls import EngineCallsInbox
from troupe.messages.engine_protocol import (
    HEADER_BYTES,
    Abort,
    AbortAll,
    EngineCallReply,
    Generate,
    GraphStatsReply,
    Hello,
    LoadLora,
    LoraAdapter,
    LoraCallError,
    LoraReply,
    ProfileEngine,
    QueryGraphStats,
    ResetCache,
    Shutdown,
    SleepEngine,
    StartFailed,
    Stopped,
    UnloadLora,
    UpdateWeightsFromDisk,
    WakeEngine,
    encode_frame,
    frame_length,
    to_engine_decoder,
)

if TYPE_CHECKING:
    from troupe.actors.engine import Engine, PromptInput
    from troupe.gpu.runner import Runner

log = structlog.get_logger("troupe.engine_process")

RunnerFactory = Callable[[EngineConfig], "Runner"]  # sent to the child: must be picklable
_CLOSE_SECONDS = 5.0  # for the last frames to reach a gateway that still reads


def run_engine_process(
    sock: socket.socket, config: EngineConfig, runner_factory: RunnerFactory | None = None
) -> None:
    """The child's entry point (a multiprocessing target). `runner_factory(config)`, called
    in the child, builds the runner the config would (tests inject faults this way)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(asyncio.run(_main(sock, config, runner_factory)))


async def _main(
    sock: socket.socket, config: EngineConfig, runner_factory: RunnerFactory | None
) -> int:
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    forwarder = EventForwarder(writer, config.max_stream_buffer)
    ready: asyncio.Future[Engine] = asyncio.get_running_loop().create_future()
    commands = asyncio.create_task(
        _apply_commands(reader, ready, forwarder, config.orphan_stop_timeout_s)
    )
    try:
        last = await _run_engine(config, runner_factory, forwarder, ready, commands)
    finally:
        commands.cancel()
    await forwarder.close(_CLOSE_SECONDS)  # every event goes out before Stopped
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(_CLOSE_SECONDS):
            writer.write(encode_frame(last))
            await writer.drain()
            writer.close()
            await writer.wait_closed()
    return 0 if isinstance(last, Stopped) and last.error is None else 1


async def _run_engine(
    config: EngineConfig,
    runner_factory: RunnerFactory | None,
    forwarder: EventForwarder,
    ready: asyncio.Future[Engine],
    commands: asyncio.Task[float],
) -> Stopped | StartFailed:
    """Serve until Shutdown, the socket's end or the engine's failure; the frame to end with."""
    from troupe.actors.engine import Engine, EngineStopped  # torch: in the child only

    try:
        runner = await asyncio.to_thread(runner_factory, config) if runner_factory else None
        async with Engine.open(config, runner=runner) as engine:
            forwarder.attach(engine.abort)
            engine.add_stats_listener(forwarder.on_stats)
            forwarder.send(
                Hello(
                    model_name=engine.model_name,
                    max_model_len=engine.max_model_len,
                    pid=os.getpid(),
                    eos_token_ids=engine.eos_token_ids,
                    classifier_labels=engine.classifier_labels,
                    is_token_classifier=engine.is_token_classifier,
                    lora_adapters=_adapters_of(engine),
                    sampling_defaults=engine.sampling_defaults,
                )
            )
            ready.set_result(engine)
            stopped = asyncio.ensure_future(engine.wait_stopped())
            await asyncio.wait({commands, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            # Shutdown's grace, or none once the gateway is gone (nobody reads the events).
            grace = commands.result() if commands.done() else 0.0
            await engine.aclose(grace)  # aborts what is left; raises EngineStopped if it failed
        return Stopped()
    except EngineStopped as exc:
        return Stopped(error=str(exc))
    except Exception as exc:
        if ready.done():  # a failure after the start (a bug here): stop, say why
            log.exception("engine process failed")
            return Stopped(error=f"engine failure: the engine process failed: {exc!r}")
        return _start_failed(exc)


async def _apply_commands(
    reader: asyncio.StreamReader,
    ready: asyncio.Future[Engine],
    forwarder: EventForwarder,
    orphan_stop_timeout_s: float,
) -> float:
    """Apply commands in order; return Shutdown's grace, or 0 once the socket closed (then
    the process ends within orphan_stop_timeout_s, stopped in order or not: orphan_exit.py)."""
    lora_calls: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references
    while True:
        try:
            header = await reader.readexactly(HEADER_BYTES)
            body = await reader.readexactly(frame_length(header))
        except (asyncio.IncompleteReadError, ConnectionError):
            if not ready.done():
                # The gateway died while the engine was loading: nobody will ever use it, and
                # a model load cannot be interrupted. Leave no orphan behind.
                os._exit(1)
            log.info("the gateway closed the engine's socket; stopping")
            arm_orphan_exit(orphan_stop_timeout_s)  # a step that never returns would hold us
            return 0.0
        engine = await ready  # the gateway sends nothing before Hello
        match to_engine_decoder.decode(body):
            case Generate(request=request):
                await engine.submit(
                    _prompt_of(request),
                    request.params,
                    forwarder.put,
                    request_id=request.request_id,
                    arrival_time=request.arrival_time,
                )
            case Abort(request_id=request_id, reason=reason):
                await engine.abort(request_id, reason)
            case AbortAll(reason=reason):
                await engine.abort_all(reason)
            case QueryGraphStats():
                forwarder.send(GraphStatsReply(graph=await engine.graph_stats()))
            case LoadLora() | UnloadLora() as call:  # a load reads files: the others go on
                task = asyncio.create_task(_answer_lora_call(engine, call, forwarder))
                lora_calls.add(task)
                task.add_done_callback(lora_calls.discard)
            case (
                ResetCache()
                | UpdateWeightsFromDisk()
                | SleepEngine()
                | WakeEngine()
                | (ProfileEngine()) as call
            ):
                task = asyncio.create_task(_answer_engine_call(engine, call, forwarder))
                lora_calls.add(task)
                task.add_done_callback(lora_calls.discard)
            case Shutdown(grace=grace):
                return grace


async def _answer_lora_call(
    engine: Engine, call: LoadLora | UnloadLora, forwarder: EventForwarder
) -> None:
    """Run one run-time LoRA call; reply with its outcome and the adapters right after it."""
    from troupe.actors.lora_registry import LoraAdapterError

    error = None
    try:
        if isinstance(call, LoadLora):
            await engine.loras.load(call.name, call.path)
        else:
            await engine.loras.unload(call.name)
    except LoraAdapterError as exc:
        error = LoraCallError(
            error_type="LoraAdapterError", message=str(exc), field=exc.field, code=exc.code
        )
    except ConfigError as exc:  # the adapter's files do not fit the model
        error = LoraCallError(error_type="ConfigError", message=str(exc))
    except Exception as exc:  # a bug: the gateway still gets its answer
        log.exception("LoRA call failed", call=call)
        error = LoraCallError(error_type="other", message=repr(exc))
    # no await since the registry changed: this reply's adapters are the change it reports
    forwarder.send(LoraReply(call_id=call.call_id, adapters=_adapters_of(engine), error=error))


async def _answer_engine_call(
    engine: Engine,
    call: ResetCache | UpdateWeightsFromDisk | SleepEngine | WakeEngine | ProfileEngine,
    forwarder: EventForwarder,
) -> None:
    """Run one of the engine's calls (actors/engine_admin.py), in a task of its own (an
    update or a sleep waits for the requests in flight); reply with its answer."""
    from troupe.actors.engine import EngineStopped

    reply: EngineCallsInbox
    try:
        if isinstance(call, ResetCache):
            reply = await engine.reset_prefix_cache()
        elif isinstance(call, ProfileEngine) and call.start:
            reply = await engine.start_profile(
                record_shapes=call.record_shapes, with_stack=call.with_stack
            )
        elif isinstance(call, ProfileEngine):
            reply = await engine.stop_profile()
        elif isinstance(call, SleepEngine):
            reply = await engine.sleep(call.level, mode=call.mode)
        elif isinstance(call, WakeEngine):
            reply = await engine.wake_up(call.tags or None)
        else:
            reply = await engine.update_weights_from_disk(
                call.model_path, call.load_format, abort_all_requests=call.abort_all_requests
            )
    except EngineStopped as exc:
        forwarder.send(EngineCallReply(call_id=call.call_id, stopped=str(exc)))
        return
    forwarder.send(EngineCallReply(call_id=call.call_id, reply=reply))


def _adapters_of(engine: Engine) -> tuple[LoraAdapter, ...]:
    return tuple(LoraAdapter(name=n, path=p) for n, p in engine.lora_adapters.items())


def _prompt_of(request: GenerateRequest) -> PromptInput:
    if request.prompt is not None:
        return request.prompt
    if request.prompt_embeds is not None:  # the rows crossed as bytes (PromptEmbeds)
        return request.prompt_embeds
    if request.messages is not None:
        return ChatPrompt(
            messages=request.messages,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            template_kwargs=request.chat_template_kwargs,
        )
    return request.prompt_token_ids or ()


def _start_failed(exc: Exception) -> StartFailed:
    from troupe.actors.core.tokenizer_files import TokenizerLoadError
    from troupe.gpu.model_config import ModelLoadError

    # The gateway raises these again and prints their message: no traceback needed here.
    if isinstance(exc, ModelLoadError):
        return StartFailed(error_type="ModelLoadError", message=str(exc))
    if isinstance(exc, TokenizerLoadError):
        return StartFailed(error_type="TokenizerLoadError", message=str(exc))
    if isinstance(exc, ConfigError):
        return StartFailed(error_type="ConfigError", message=str(exc))
    log.error("engine failed to start", exc_info=exc)
    return StartFailed(error_type="other", message=repr(exc))
