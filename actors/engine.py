"""The Engine: builds the actor graph (actors/wiring.py), supervises it, and is the public API.

Callers talk to the tokenizer's inbox (the client edge, bounded: callers feel backpressure) and
read their events from ClientStreams, which the engine's router fills from the streamer's
StreamBatches. An actor that raises, or an executor step that hangs past `step_timeout_s`,
stops the graph: every open request gets a Failed event, `is_healthy` turns False and new
requests are refused with the same message (actors/engine_death.py: "engine dead: <cause>" when
the runner can never step again).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import ExitStack, aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus
from troupe.actors import startup
from troupe.actors.client_streams import ClientStreams, EventListener
from troupe.actors.core.executor import ExecutorCore
from troupe.actors.engine_admin import EngineAdmin
from troupe.actors.engine_death import failure_message, pools_gone, stop_cause
from troupe.actors.engine_stopped import EngineStopped as EngineStopped  # the engine's API
from troupe.actors.exception_groups import unwrap_single
from troupe.actors.heap_freeze import frozen_heap
from troupe.actors.lora_registry import LoraRegistry
from troupe.actors.request_input import RequestInputError, to_generate_request
from troupe.actors.request_log import log_end
from troupe.actors.shell import Actor, Outbox
from troupe.actors.switch_interval import switch_interval
from troupe.actors.watchdog import watch_executor
from troupe.actors.wiring import wire
from troupe.config import EngineConfig
from troupe.gpu.runner import RunnerStats
from troupe.logs import configure_logging
from troupe.messages import (
    AbortRequest,
    ChatPrompt,
    EngineStats,
    GenerateRequest,
    PromptEmbeds,
    RejectCode,
    Rejected,
    SamplingParams,
    StreamBatch,
    StreamEvent,
)
from troupe.messages.sampling_defaults import NO_DEFAULTS

if TYPE_CHECKING:
    from troupe.gpu.runner import Runner

log = structlog.get_logger("troupe.engine")

# PromptEmbeds: input embeddings in place of a prompt (gpu/embed_rows.prompt_embeds_of)
PromptInput = (
    str | Sequence[int] | Sequence[Mapping[str, Any]] | Sequence[Any] | ChatPrompt | PromptEmbeds
)


class Engine:
    """An actor graph around one executor. Open with `Engine.open(config)` or
    `Engine.start(config, task_group)`; stream with `engine.generate(...)`."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_name = ""
        self.max_model_len = 0
        self.eos_token_ids: tuple[int, ...] = ()  # the model's, once loaded
        self.classifier_labels: tuple[str, ...] = ()  # a classification model's; once loaded
        self.is_token_classifier = False  # its labels are per token (token_classify only)
        self.sampling_defaults = NO_DEFAULTS  # for what a request leaves unset; once read
        self.tokenizer: Any = None
        self.error: BaseException | None = None
        self.failure: str | None = None  # once dead: why, as every request is told
        self._streams = ClientStreams(config.max_stream_buffer)
        self._listeners: list[EventListener] = []
        self._stats_listeners: list[Callable[[EngineStats], None]] = []
        self._stats = EngineStats()
        self._to_tokenizer: Outbox | None = None
        self._cancel_scope = anyio.CancelScope()
        self._stopped = anyio.Event()
        self._is_closing = False
        self._tg: TaskGroup | None = None
        self._executor: ExecutorCore | None = None
        self._injected_runner: Runner | None = None
        self._vocab_size: int | None = None  # the model's, once loaded
        self._actors: list[Actor] = []
        # LoRA adapters by name: checked at this edge, loaded and unloaded at run time
        self.loras = LoraRegistry(config)
        self.admin = EngineAdmin(config, self.abort_all)  # calls beside requests: its methods
        self.reset_prefix_cache = self.admin.reset_prefix_cache
        self.update_weights_from_disk = self.admin.update_weights_from_disk
        self.update_weights_from_tensors = self.admin.update_weights_from_tensors
        self.sleep, self.wake_up = self.admin.sleep, self.admin.wake_up  # sleep mode
        self.is_sleeping = self.admin.is_sleeping
        self.start_profile, self.stop_profile = self.admin.start_profile, self.admin.stop_profile
        self.graph_stats = self.admin.graph_stats  # the actors' counts (the live view)

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls, config: EngineConfig | None = None, *, runner: Runner | None = None
    ) -> AsyncIterator[Engine]:
        """Start an engine in its own task group; stop it on exit.

        Errors leave as themselves (a ModelLoadError, the caller's own exception), not wrapped
        in the ExceptionGroup the task group would make of a single failure."""
        with unwrap_single():
            async with anyio.create_task_group() as tg:
                engine = await cls.start(config or EngineConfig(), tg, runner=runner)
                try:
                    yield engine
                finally:
                    await engine.aclose()

    @classmethod
    async def start(
        cls, config: EngineConfig, task_group: TaskGroup, *, runner: Runner | None = None
    ) -> Engine:
        """Start inside a caller's task group (a trio nursery works too, via anyio).

        `runner`: an already built runner to drive instead of the one `config` describes (tests
        inject faults this way); its steps run in a worker thread."""
        engine = cls(config)
        engine._injected_runner = runner
        await task_group.start(engine._run)
        return engine

    @property
    def lora_adapters(self) -> dict[str, str]:
        """The LoRA adapters a request may name now (SamplingParams.lora): folders by name.
        `engine.loras.load(name, path)` / `.unload(name)` change them."""
        return self.loras.adapters

    @property
    def is_healthy(self) -> bool:
        """False once the graph has stopped because an actor failed (or the executor hung)."""
        return self.error is None and not self._stopped.is_set()

    async def wait_stopped(self) -> None:
        """Until the actor graph has stopped (closed, or crashed: then `error` is set)."""
        await self._stopped.wait()

    async def aclose(self, grace: float = 5.0) -> None:
        """Abort what is in flight, wait up to `grace` s for terminal events, stop the actors."""
        if not self._is_closing:
            self._is_closing = True
            with anyio.CancelScope(shield=True):
                if not self._stopped.is_set():
                    await self.abort_all("engine shutting down")
                    with anyio.move_on_after(grace):
                        await self._streams.wait_empty()
                self._fail_open("engine stopped before this request finished")
                self._cancel_scope.cancel()
                await self._stopped.wait()
        if self.error is not None:
            raise EngineStopped(self.failure) from self.error

    async def _run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        if not structlog.is_configured():  # an app that set up structlog keeps its own set-up
            configure_logging(config.log_format, config.log_level)
        setup, self.tokenizer, self.sampling_defaults = await anyio.to_thread.run_sync(
            startup.load_engine_parts, config, self._injected_runner
        )
        config = setup.config  # max_num_batched_tokens resolved for the device
        self.model_name = setup.model_name
        self.max_model_len = setup.numbers.max_model_len
        self.eos_token_ids = tuple(setup.numbers.eos_token_ids)
        self.classifier_labels = tuple(setup.numbers.classifier_labels)
        self.is_token_classifier = setup.numbers.is_token_classifier
        self._vocab_size = setup.numbers.vocab_size
        tracer = None
        try:  # a bad trace path, a core that refuses the config: the runner is closed all the same
            tracer = startup.open_trace(setup)
            graph = wire(setup.graph_specs(), setup.graph_inputs(self.tokenizer), tracer)
        except BaseException:
            await startup.close_failed_start(setup, tracer)
            raise
        self._actors = list(graph.actors)
        self.admin.attach(graph)
        self._executor = next(a.core for a in graph.actors if isinstance(a.core, ExecutorCore))
        self.loras.runtime = self._executor.runner.lora
        self._to_tokenizer = graph.to_tokenizer
        try:
            interval = switch_interval(config.gil_switch_interval_s)
            with self._cancel_scope, interval, ExitStack() as heap:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    tg.start_soon(self._route, graph.client_inbox)
                    tg.start_soon(self.admin.serve)
                    for actor in graph.actors:
                        await tg.start(actor.run)
                        if actor.name == "executor" and setup.is_blocking and config.step_timeout_s:
                            tg.start_soon(watch_executor, actor, config.step_timeout_s)
                    heap.enter_context(frozen_heap(config.gc_freeze))
                    blocks = setup.numbers.num_gpu_blocks, setup.numbers.num_cpu_blocks
                    log.info("engine ready", model=self.model_name, num_gpu_blocks=blocks[0],
                             num_cpu_blocks=blocks[1])  # fmt: skip
                    task_status.started()
        except Exception as exc:  # an actor crashed: fail its requests, keep the caller alive
            self.error = stop_cause(exc)
            self.failure = failure_message(self.error)
            log.error("engine crashed", failure=self.failure, exc_info=self.error)
            self._stats = pools_gone(self._stats)  # the runner and the allocator go with it
            self._fail_open(self.failure)
        finally:
            self._is_closing = True
            with anyio.CancelScope(shield=True):
                await graph.to_tokenizer.aclose()
                if tracer is not None:
                    tracer.close()
                await startup.close_engine_parts(setup, graph.actors)
            self._stopped.set()

    async def _route(self, inbox: Any) -> None:
        async with inbox:
            async for batch in inbox:
                assert isinstance(batch, StreamBatch), batch
                if batch.stats is not None:
                    self._stats = batch.stats
                    for stats_listener in self._stats_listeners:
                        stats_listener(batch.stats)
                cut_off = self._streams.dispatch(batch, time.monotonic(), self._listeners)
                for event in batch.events:
                    if event.is_terminal:
                        log_end(event)
                        self.loras.ended(event.request_id)
                for request_id in cut_off:
                    assert self._tg is not None
                    self._tg.start_soon(self._send_abort, request_id, "stream reader too slow")

    async def _send_abort(self, request_id: str, reason: str) -> None:
        if self._to_tokenizer is not None and not self._stopped.is_set():
            try:
                await self._to_tokenizer.send(AbortRequest(request_id=request_id, reason=reason))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    # -- public API ----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """Latest snapshot published by the scheduler."""
        return self._stats

    def default_sampling_params(self) -> SamplingParams:
        """What `generate` and `submit` use when given no params: the model's defaults."""
        return self.sampling_defaults.params(self.max_model_len)

    @property
    def runner_busy_seconds(self) -> float:
        """Seconds the runner has spent executing steps (to separate model from graph cost)."""
        return self._executor.busy_seconds if self._executor is not None else 0.0

    def runner_stats(self) -> RunnerStats:
        """The runner's statistics() (benchmarks): steps, overlapped steps and their hits."""
        return self._executor.runner.statistics() if self._executor is not None else RunnerStats()

    def actor_busy_seconds(self) -> dict[str, float]:
        """Seconds each actor has spent in its core's handle() (benchmarks, diagnostics)."""
        return {actor.name: actor.busy_seconds for actor in self._actors}

    @property
    def num_active(self) -> int:
        """Requests whose stream is still open."""
        return len(self._streams)

    def add_event_listener(self, listener: EventListener) -> None:
        """Call `listener(event, now)` for every event the engine dispatches (metrics)."""
        self._listeners.append(listener)

    def add_stats_listener(self, listener: Callable[[EngineStats], None]) -> None:
        """Call `listener(stats)` for every stats snapshot the scheduler publishes (also those
        that come without events: an engine in a child process forwards them)."""
        self._stats_listeners.append(listener)

    async def abort_all(self, reason: str = "aborted") -> None:
        for request_id in self._streams.ids():
            await self._send_abort(request_id, reason)

    async def generate(
        self,
        prompt: PromptInput,
        params: SamplingParams | Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one request's events: Deltas, then exactly one terminal event. No params:
        default_sampling_params(); a SamplingParams or a mapping is taken as it is.

        Leaving the loop early (break, cancellation) aborts the request and frees its blocks."""
        request_id = request_id or f"req-{next(_ids)}"
        request_or_reject = self._prepare(request_id, prompt, params)
        if isinstance(request_or_reject, Rejected):
            yield request_or_reject
            return
        stream = self._streams.open(request_id)
        try:
            await self._send_request(request_or_reject)
            async with aclosing(stream.events()) as events:
                async for event in events:
                    yield event
        finally:
            self._streams.close(request_id)
            if not stream.is_ended:
                with anyio.CancelScope(shield=True):
                    await self._send_abort(request_id, "client went away")

    async def submit(
        self,
        prompt: PromptInput,
        params: SamplingParams | Mapping[str, Any] | None,
        on_event: Callable[[StreamEvent], None],
        *,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Start a request whose events are passed to `on_event` on the event loop, ending
        with exactly one terminal event; returns its id. For batch jobs: no task per request.
        Cancel with `abort(request_id)`. `arrival_time` (time.monotonic()): when the request
        reached the caller's edge, if earlier than now (a gateway in another process)."""
        request_id = request_id or f"req-{next(_ids)}"
        request_or_reject = self._prepare(request_id, prompt, params, arrival_time)
        if isinstance(request_or_reject, Rejected):
            on_event(request_or_reject)
            return request_id
        self._streams.open_callback(request_id, on_event)
        try:
            await self._send_request(request_or_reject)
        except BaseException:
            self._streams.close(request_id)
            raise
        return request_id

    async def abort(self, request_id: str, reason: str = "aborted") -> None:
        """Abort one request; its stream still ends with one terminal event (Aborted)."""
        await self._send_abort(request_id, reason)

    def _prepare(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | Mapping[str, Any] | None,
        arrival_time: float | None = None,
    ) -> GenerateRequest | Rejected:
        now = time.monotonic() if arrival_time is None else arrival_time
        params = self.default_sampling_params() if params is None else params
        try:
            request = to_generate_request(
                request_id, prompt, params, now, vocab_size=self._vocab_size
            )
        except RequestInputError as exc:
            return self._reject_here(request_id, RejectCode.INVALID_REQUEST, exc.field, str(exc))
        if self._is_closing or self._to_tokenizer is None:
            reason = self.failure or "the engine is shutting down"
            return self._reject_here(request_id, RejectCode.SHUTTING_DOWN, None, reason)
        if request_id in self._streams:
            message = f"request_id {request_id!r} is already in use"
            return self._reject_here(request_id, RejectCode.INVALID_REQUEST, "request_id", message)
        admitted = self.loras.admit(request)
        if isinstance(admitted, str):
            return self._reject_here(request_id, RejectCode.INVALID_REQUEST, "lora", admitted)
        log.debug("request received", request_id=request_id, max_tokens=request.params.max_tokens)
        return admitted

    async def _send_request(self, request: GenerateRequest) -> None:
        assert self._to_tokenizer is not None
        try:
            await self._to_tokenizer.send(request)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.loras.ended(request.request_id)
            self._streams.fail_one(request.request_id, "the engine stopped")

    def _fail_open(self, message: str) -> None:
        """Fail every open stream; listeners (metrics) count those requests as failed too."""
        now = time.monotonic()
        for event in self._streams.fail_all(message):
            for listener in self._listeners:
                listener(event, now)

    def _reject_here(
        self, request_id: str, code: RejectCode, field: str | None, message: str
    ) -> Rejected:
        event = Rejected(request_id=request_id, code=code, field=field, message=message)
        log_end(event)
        now = time.monotonic()
        for listener in self._listeners:
            listener(event, now)
        return event


# Engine-made request ids; a caller's own ids are checked for clashes at the client edge.
_ids = itertools.count(1)
