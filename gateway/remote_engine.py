"""RemoteEngine: the gateway's handle on an engine in a child process (gateway/engine_process.py).

It is the EngineLike of gateway/engine_api.py over the engine protocol
(messages/engine_protocol.py), with the in-process Engine's client-edge semantics: requests are
checked here (a bad one is Rejected without a round trip), every stream ends with exactly one
terminal event, leaving a stream early aborts its request, a reader too far behind is cut off.

The socket is read by an asyncio Protocol: the loop hands it bytes as they come, no task and no
polling; each EventBatch is dispatched to the per-request streams (actors/client_streams.py, the
same as the Engine's) with the engine's delivery time, so metrics listeners see the engine's
own inter-token gaps. Commands are written at once, in call order, so an abort can never
overtake its request; a caller then waits while the socket's buffer is full (backpressure).

If the child dies, or its engine does (its Stopped frame names why: "engine dead: <cause>" for
a runner that can never step again, actors/engine_death.py), every open stream gets one Failed
event with that message (listeners see it too: /metrics counts it), new requests are refused
with it, the stats show the pools gone, `is_healthy` turns False and `wait_stopped` returns:
`troupe serve` answers /health with 503 and exits 1, as with an engine that fails in-process.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any

import structlog
from troupe.actors.client_streams import STOPPED, ClientStreams, EventListener
from troupe.actors.engine_death import pools_gone
from troupe.actors.request_input import RequestInputError, to_generate_request
from troupe.gateway.engine_api import TokenizerLike
from troupe.gateway.remote_admin import RemoteAdmin
from troupe.gateway.remote_loras import RemoteLoras
from troupe.messages import (
    EngineStats,
    GenerateRequest,
    RejectCode,
    Rejected,
    SamplingParams,
    StreamBatch,
    StreamEvent,
)
from troupe.messages.engine_protocol import (
    Abort,
    AbortAll,
    EngineCallReply,
    EventBatch,
    FrameSplitter,
    FromEngine,
    Generate,
    GraphStatsReply,
    Hello,
    LoraReply,
    QueryGraphStats,
    StartFailed,
    Stopped,
    ToEngine,
    encode_frame,
    from_engine_decoder,
)
from troupe.messages.graph_stats import GraphStats
from troupe.messages.sampling_defaults import NO_DEFAULTS

log = structlog.get_logger("troupe.gateway")

# the failure when the socket just closes
DIED = "engine failure: the engine process exited unexpectedly"


class RemoteEngine(asyncio.Protocol):
    """An engine in another process, behind one socket. Built by `open_remote_engine`
    (gateway/engine_launch.py)."""

    def __init__(self, max_stream_buffer: int) -> None:
        self.model_name = ""
        self.max_model_len = 0
        self.eos_token_ids: tuple[int, ...] = ()  # the model's, from Hello (beam search)
        self.classifier_labels: tuple[str, ...] = ()  # from Hello: POST /classify's labels
        self.is_token_classifier = False  # from Hello: the labels are per token
        self.sampling_defaults = NO_DEFAULTS  # from Hello: for what a request leaves unset
        self.pid = 0  # the engine process, once it said Hello
        self.failure: str | None = None  # why the engine stopped, if it failed
        self._tokenizer: TokenizerLike | None = None
        self._streams = ClientStreams(max_stream_buffer)
        self._listeners: list[EventListener] = []
        self._stats = EngineStats()
        self._transport: asyncio.Transport | None = None
        self._frames = FrameSplitter()
        self._hello: asyncio.Future[Hello] = asyncio.get_running_loop().create_future()
        self._writable = asyncio.Event()
        self._writable.set()
        self._stopped = asyncio.Event()
        self._is_closing = False
        # Waiters of graph_stats(), answered in the order asked (one socket, FIFO both ways).
        self._graph_queries: collections.deque[asyncio.Future[GraphStats]] = collections.deque()
        self.loras = RemoteLoras(self._send)  # run-time LoRA loads, answered by call id
        self.admin = RemoteAdmin(self._send)  # the engine's calls beside requests, by call id
        self.reset_prefix_cache = self.admin.reset_prefix_cache
        self.update_weights_from_disk = self.admin.update_weights_from_disk
        self.sleep, self.wake_up = self.admin.sleep, self.admin.wake_up  # sleep mode
        self.is_sleeping = self.admin.is_sleeping
        self.start_profile, self.stop_profile = self.admin.start_profile, self.admin.stop_profile

    # -- the EngineLike slice ----------------------------------------------------------------

    @property
    def tokenizer(self) -> TokenizerLike:
        assert self._tokenizer is not None, "the tokenizer is loaded before the engine is used"
        return self._tokenizer

    @property
    def lora_adapters(self) -> dict[str, str]:
        """The engine's adapters, name -> folder: from Hello, then each LoRA call's reply."""
        return self.loras.adapters

    @property
    def num_active(self) -> int:
        return len(self._streams)

    @property
    def is_healthy(self) -> bool:
        return self.failure is None and not self._stopped.is_set()

    async def wait_stopped(self) -> None:
        """Until the engine process has stopped (closed, or died: then `error` is set)."""
        await self._stopped.wait()

    def stats(self) -> EngineStats:
        """The latest snapshot the engine sent."""
        return self._stats

    async def graph_stats(self) -> GraphStats:
        """The engine's actor counts now: one round trip (empty once the engine stopped)."""
        if self._stopped.is_set():
            return GraphStats()
        reply: asyncio.Future[GraphStats] = asyncio.get_running_loop().create_future()
        self._graph_queries.append(reply)
        self._send(QueryGraphStats())
        return await reply

    def add_event_listener(self, fn: EventListener) -> None:
        """Call `fn(event, time)` for every event, `time` being when the engine delivered it."""
        self._listeners.append(fn)

    async def abort(self, request_id: str, reason: str = "aborted") -> None:
        self._send(Abort(request_id=request_id, reason=reason))
        await self._writable.wait()

    async def abort_all(self, reason: str = "aborted") -> None:
        self._send(AbortAll(reason=reason))
        await self._writable.wait()

    async def generate(
        self,
        prompt: Any,
        params: SamplingParams | Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """Stream one request's events: Deltas, then exactly one terminal event. Leaving the
        loop early (break, cancellation) aborts the request in the engine."""
        request_id = request_id or f"req-{next(_ids)}"
        request = self._prepare(request_id, prompt, params)
        if isinstance(request, Rejected):
            yield request
            return
        stream = self._streams.open(request_id)
        try:
            # Written before the first await: a later abort of this id travels behind it.
            self._send(Generate(request=request))
            await self._writable.wait()
            async with aclosing(stream.events(self._failure_message)) as events:
                async for event in events:
                    yield event
        finally:
            self._streams.close(request_id)
            if not stream.is_ended:
                self._send(Abort(request_id=request_id, reason="client went away"))

    def _prepare(
        self, request_id: str, prompt: Any, params: SamplingParams | Mapping[str, Any] | None
    ) -> GenerateRequest | Rejected:
        """The client edge, as Engine._prepare (the engine checks token ids against the
        vocabulary again: a prompt it refuses comes back Rejected)."""
        if params is None:  # the model's defaults, as Engine's
            params = self.sampling_defaults.params(self.max_model_len)
        try:
            request = to_generate_request(request_id, prompt, params, time.monotonic())
        except RequestInputError as exc:
            return self._reject(request_id, RejectCode.INVALID_REQUEST, exc.field, str(exc))
        if self._is_closing or not self.is_healthy:
            reason = self.failure or "the engine is shutting down"
            return self._reject(request_id, RejectCode.SHUTTING_DOWN, None, reason)
        if request_id in self._streams:
            message = f"request_id {request_id!r} is already in use"
            return self._reject(request_id, RejectCode.INVALID_REQUEST, "request_id", message)
        return request

    def _reject(
        self, request_id: str, code: RejectCode, field: str | None, message: str
    ) -> Rejected:
        event = Rejected(request_id=request_id, code=code, field=field, message=message)
        now = time.monotonic()
        for listener in self._listeners:
            listener(event, now)
        return event

    def _failure_message(self) -> str:
        return self.failure or STOPPED

    def _send(self, command: ToEngine) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(encode_frame(command))

    # -- asyncio.Protocol: the socket --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        for body in self._frames.feed(data):
            self._on_reply(from_engine_decoder.decode(body))

    def pause_writing(self) -> None:
        self._writable.clear()  # the engine reads slower than commands come: callers wait

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()  # nobody waits on a dead socket
        if not self._stopped.is_set():
            self._stop(DIED if self.pid else None, exc)

    def _on_reply(self, reply: FromEngine) -> None:
        match reply:
            case EventBatch():
                if reply.stats is not None:
                    self._stats = reply.stats
                batch = StreamBatch(events=reply.events)
                for request_id in self._streams.dispatch(batch, reply.time, self._listeners):
                    self._send(Abort(request_id=request_id, reason="stream reader too slow"))
            case Hello():
                self.model_name, self.max_model_len, self.pid = (
                    reply.model_name,
                    reply.max_model_len,
                    reply.pid,
                )
                self.eos_token_ids = reply.eos_token_ids
                self.classifier_labels = reply.classifier_labels
                self.is_token_classifier = reply.is_token_classifier
                self.sampling_defaults = reply.sampling_defaults
                self.loras.show(reply.lora_adapters)
                self._hello.set_result(reply)
            case StartFailed():
                self._hello.set_exception(start_error(reply))
            case GraphStatsReply():
                waiter = self._graph_queries.popleft()
                if not waiter.done():  # its caller may have given up
                    waiter.set_result(reply.graph)
            case LoraReply():
                self.loras.on_reply(reply)
            case EngineCallReply():
                self.admin.on_reply(reply)
            case Stopped():
                self._stop(reply.error, None)

    def _stop(self, error: str | None, exc: Exception | None) -> None:
        """The engine is gone (cleanly when `error` is None): fail what is still open."""
        if error is not None:
            self.failure = error
            self._stats = pools_gone(self._stats)
            log.error("engine process failed", error=error, pid=self.pid)
        self._is_closing = True
        now = time.monotonic()
        for event in self._streams.fail_all(self._failure_message()):
            for listener in self._listeners:  # metrics count these as failed requests too
                listener(event, now)
        self._stopped.set()
        self.loras.stop(self._failure_message())
        self.admin.stop(self._failure_message())
        while self._graph_queries:
            waiter = self._graph_queries.popleft()
            if not waiter.done():
                waiter.set_result(GraphStats())
        if not self._hello.done():
            self._hello.set_exception(
                RuntimeError(f"the engine process exited before it started ({exc or 'no error'})")
            )

    # -- lifecycle (open_remote_engine) ------------------------------------------------------

    async def wait_started(self, tokenizer: Callable[[], TokenizerLike]) -> None:
        """Until the engine said Hello (raises its start-up error); then load the tokenizer
        here too: the gateway decodes single tokens for logprobs with it."""
        await self._hello
        self._tokenizer = await asyncio.to_thread(tokenizer)

    async def shutdown(self, command: ToEngine) -> None:
        """Ask the engine to stop; until it has (the caller bounds the wait)."""
        self._is_closing = True
        self._send(command)
        await self._stopped.wait()

    def close_transport(self) -> None:
        if self._transport is not None:
            self._transport.close()


def start_error(reply: StartFailed) -> Exception:
    """The start-up error the engine reported, as the class the in-process engine raises, so
    `troupe serve` prints the same message."""
    from troupe.config import ConfigError

    if reply.error_type == "ConfigError":
        return ConfigError(reply.message)
    if reply.error_type == "ModelLoadError":
        from troupe.gpu.model_config import ModelLoadError

        return ModelLoadError(reply.message)
    if reply.error_type == "TokenizerLoadError":
        from troupe.actors.core.tokenizer_files import TokenizerLoadError

        return TokenizerLoadError(reply.message)
    return RuntimeError(f"the engine failed to start: {reply.message}")


# Gateway-made request ids when the caller gives none (the gateway always does).
_ids = itertools.count(1)
