"""The Engine's calls beside requests, for ops and RLHF loops (messages/engine_calls.py):

    reset_prefix_cache()          vLLM's /reset_prefix_cache: drop every cached prefix block no
                                  request holds (GPU and CPU tiers); running requests go on
    update_weights_from_disk(p)   SGLang's /update_weights_from_disk: copy a checkpoint of the
                                  served model's shapes into its weights in place, then reset
                                  the prefix cache (its KV came from the old weights)

A weight update waits for the requests the scheduler has taken to end, as SGLang's does (they
finish on the old weights); requests that reach it meanwhile wait and run on the new ones, so
no request ever mixes the two. `abort_all_requests=True` aborts what is in flight first.
One update runs at a time; a second is refused (BUSY). A refusal changes nothing.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable

import anyio
import structlog
from troupe.actors.engine_stopped import EngineStopped
from troupe.actors.wiring import WiredGraph
from troupe.config import EngineConfig
from troupe.messages.engine_calls import (
    EngineCallsInbox,
    PrefixCacheReset,
    ResetPrefixCache,
    UpdateWeights,
    WeightsErrorCode,
    WeightsUpdated,
)
from troupe.messages.graph_stats import GraphStats

log = structlog.get_logger("troupe.engine")

LOAD_FORMATS = ("auto", "safetensors")  # SGLang's names for what the update reads


class EngineAdmin:
    """Sends the calls into the scheduler's inbox and hands each caller its reply."""

    def __init__(self, config: EngineConfig, abort_all: Callable[[str], Awaitable[None]]) -> None:
        self._config = config
        self._abort_all = abort_all
        self._graph: WiredGraph | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, anyio.Event] = {}
        self._replies: dict[int, EngineCallsInbox] = {}
        self._updating: int | None = None  # the call id of the update not yet answered
        self._stopped: str | None = None

    def attach(self, graph: WiredGraph) -> None:
        """The graph the calls go into, once wired."""
        self._graph = graph

    async def serve(self) -> None:
        """Hand out replies until the graph stops (a task of the engine's)."""
        assert self._graph is not None, "attach() first"
        try:
            async with self._graph.to_scheduler, self._graph.calls_inbox as replies:
                async for reply in replies:
                    self._on_reply(reply)
        finally:
            self._stop("the engine stopped")

    async def graph_stats(self) -> GraphStats:
        """Each actor's message counts and inbox now (the gateway's live view). Async so that
        an engine in another process answers the same call (gateway/remote_engine.py)."""
        if self._graph is None:
            return GraphStats(time=time.monotonic())
        inbox = self._graph.client_inbox.statistics()
        return GraphStats(
            actors=tuple(actor.statistics() for actor in self._graph.actors),
            client_inbox_depth=inbox.current_buffer_used,
            client_inbox_buffer=int(inbox.max_buffer_size),
            time=time.monotonic(),
        )

    async def reset_prefix_cache(self) -> PrefixCacheReset:
        """Drop every cached prefix block no request holds, in the GPU pool and the CPU tier;
        running requests keep theirs. The reply counts the blocks dropped."""
        call_id = next(self._ids)
        await self._send(call_id, ResetPrefixCache(call_id=call_id))
        reply = await self._wait(call_id)
        assert isinstance(reply, PrefixCacheReset), reply
        log.info("prefix cache reset", num_gpu_blocks=reply.dropped.num_gpu_blocks,
                 num_cpu_blocks=reply.dropped.num_cpu_blocks)  # fmt: skip
        return reply

    async def update_weights_from_disk(
        self,
        model_path: str,
        load_format: str | None = None,
        *,
        abort_all_requests: bool = False,
    ) -> WeightsUpdated:
        """Copy the checkpoint in folder `model_path` (config.json + safetensors of the served
        model's architecture, shapes and dtype) into the weights, then reset the prefix cache.
        Waits for the requests in flight (or aborts them: `abort_all_requests`); the reply's
        `success` and `message` say how it went, `error` why not (nothing then changed)."""
        call_id = next(self._ids)
        if (refusal := self._refusal(model_path, load_format)) is not None:
            code, message = refusal
            return WeightsUpdated(call_id=call_id, message=message, error=code)
        self._updating = call_id  # until its reply, even if its caller leaves
        try:
            if abort_all_requests:
                await self._abort_all("aborted for a weight update")
            await self._send(call_id, UpdateWeights(call_id=call_id, model_path=model_path))
        except BaseException:
            self._updating = None  # never sent
            raise
        reply = await self._wait(call_id)
        assert isinstance(reply, WeightsUpdated), reply
        return reply

    def _refusal(
        self, model_path: object, load_format: object
    ) -> tuple[WeightsErrorCode, str] | None:
        config, invalid = self._config, WeightsErrorCode.INVALID
        if not isinstance(model_path, str) or not model_path:
            return invalid, "model_path must be the path of a checkpoint's folder"
        if load_format is not None and load_format not in LOAD_FORMATS:
            return invalid, (
                f"load_format {load_format!r} is not supported: the update reads safetensors "
                f"({' or '.join(LOAD_FORMATS)})"
            )
        if config.tensor_parallel_size > 1:
            return WeightsErrorCode.UNSUPPORTED, (
                f"tensor_parallel_size {config.tensor_parallel_size}: weights are not updated "
                "across ranks yet; restart the engine on the new checkpoint"
            )
        if config.disaggregation != "none":
            return WeightsErrorCode.UNSUPPORTED, (
                f"disaggregation {config.disaggregation!r}: two runners hold the weights; "
                "restart the engine on the new checkpoint"
            )
        if self._updating is not None:
            return WeightsErrorCode.BUSY, f"weight update {self._updating} has not ended yet"
        return None

    async def _send(self, call_id: int, command: ResetPrefixCache | UpdateWeights) -> None:
        if self._stopped is not None or self._graph is None:
            raise EngineStopped(self._stopped or "the engine has not started")
        self._waiting[call_id] = anyio.Event()
        try:
            await self._graph.to_scheduler.send(command)  # unbounded: never waits
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._waiting.pop(call_id, None)
            raise EngineStopped("the engine stopped") from None

    async def _wait(self, call_id: int) -> EngineCallsInbox:
        try:
            await self._waiting[call_id].wait()
        finally:
            self._waiting.pop(call_id, None)
        reply = self._replies.pop(call_id, None)
        if reply is None:
            raise EngineStopped(self._stopped or "the engine stopped")
        return reply

    def _on_reply(self, reply: EngineCallsInbox) -> None:
        if isinstance(reply, WeightsUpdated):
            call_ids: tuple[int, ...] = (reply.call_id,)
            if self._updating == reply.call_id:
                self._updating = None
            log.info("weight update ended", success=reply.success, message=reply.message,
                     num_paused_requests=reply.num_paused_requests)  # fmt: skip
        else:
            call_ids = reply.call_ids
        for call_id in call_ids:
            if (done := self._waiting.get(call_id)) is not None:  # its caller may have left
                self._replies[call_id] = reply
                done.set()

    def _stop(self, why: str) -> None:
        self._stopped, self._updating = why, None
        for done in self._waiting.values():
            done.set()
