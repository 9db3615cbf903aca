"""The Engine's calls beside requests, for ops and RLHF loops (messages/engine_calls.py):

    reset_prefix_cache()          vLLM's /reset_prefix_cache: drop every cached prefix block no
                                  request holds (GPU and CPU tiers); running requests go on
    update_weights_from_disk(p)   SGLang's /update_weights_from_disk: copy a checkpoint of the
                                  served model's shapes into its weights in place, then reset
                                  the prefix cache (its KV came from the old weights)

    update_weights_from_tensors   SGLang's: the same from HF-named tensors in this process
    sleep(level) / wake_up(tags)  vLLM's sleep mode (EngineConfig.enable_sleep_mode; messages/
    is_sleeping()                 sleep_calls.py): the device memory given back and taken again
    start_profile() /             the torch profiler around the executor's steps
    stop_profile()                (EngineConfig.profiler_dir; messages/profile_calls.py)

A weight update waits for the requests the scheduler has taken to end, as SGLang's does (they
finish on the old weights); requests that reach it meanwhile wait and run on the new ones, so
no request ever mixes the two. `abort_all_requests=True` aborts what is in flight first.
One update runs at a time; a second is refused (BUSY). A refusal changes nothing. A sleep is
refused while requests are live (mode "refuse", vLLM's rule), or lets them end ("wait") or
aborts them ("abort"); requests sent while asleep wait for the wake_up.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import anyio
import structlog
from troupe.actors.core.executor import ExecutorCore
from troupe.actors.engine_stopped import EngineStopped
from troupe.actors.wiring import WiredGraph
from troupe.config import EngineConfig
from troupe.gpu.runner import ReloadsWeights
from troupe.messages.engine_calls import (
    EngineCallsInbox,
    PrefixCacheReset,
    ResetPrefixCache,
    UpdateWeights,
    WeightsErrorCode,
    WeightsUpdated,
)
from troupe.messages.graph_stats import GraphStats
from troupe.messages.profile_calls import ProfileErrorCode, ProfileReply, StartProfile, StopProfile
from troupe.messages.sleep_calls import (
    ALL_TAGS,
    SLEEP_LEVELS,
    SLEEP_MODES,
    Sleep,
    SleepErrorCode,
    SleepMode,
    SleepReply,
    SleepTag,
    WakeUp,
)

if TYPE_CHECKING:
    import torch
    from troupe.gpu.weight_update import WeightReload

log = structlog.get_logger("troupe.engine")

ProfileCall = StartProfile | StopProfile

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
        self._sleep = SleepReply(call_id=0, message="awake")  # the last sleep or wake_up's
        self._weights: WeightReload | None = None  # where tensors are staged for an update

    def attach(self, graph: WiredGraph) -> None:
        """The graph the calls go into, once wired."""
        self._graph = graph
        executor = next((a.core for a in graph.actors if isinstance(a.core, ExecutorCore)), None)
        if executor is not None and isinstance(executor.runner, ReloadsWeights):
            self._weights = executor.runner.weights

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
        command = UpdateWeights(call_id=call_id, model_path=model_path)
        return await self._update(command, abort_all_requests)

    async def update_weights_from_tensors(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        load_format: str | None = None,
        *,
        abort_all_requests: bool = False,
    ) -> WeightsUpdated:
        """As update_weights_from_disk, from HF-named tensors (on any device; every weight of
        the served model, float32/float16/bfloat16) instead of a folder: SGLang's call, for an
        RL trainer in this process. Copied after the requests in flight end."""
        call_id = next(self._ids)
        refusal = self._refusal("tensors", load_format)
        if refusal is None and self._weights is None:
            refusal = WeightsErrorCode.UNSUPPORTED, "this runner cannot replace its weights"
        if refusal is not None:
            code, message = refusal
            return WeightsUpdated(call_id=call_id, message=message, error=code)
        assert self._weights is not None
        self._weights.stage(call_id, named_tensors)
        try:
            command = UpdateWeights(call_id=call_id, model_path="", from_tensors=True)
            return await self._update(command, abort_all_requests)
        finally:
            self._weights.unstage(call_id)  # taken, or never sent

    async def sleep(self, level: int = 1, *, mode: SleepMode = "refuse") -> SleepReply:
        """Give the device memory back (vLLM's LLM.sleep): level 1 keeps the weights in CPU
        memory, level 2 drops them (load new ones after wake_up(["weights"])); the KV cache
        and the prefix cache go. Live requests: refused naming them (mode "refuse"), awaited
        ("wait") or aborted first ("abort"). Requests sent while asleep wait for wake_up."""
        call_id = next(self._ids)
        if (error := self._sleep_refusal()) is None:
            if level not in SLEEP_LEVELS:
                error = SleepErrorCode.INVALID, f"level must be 1 or 2, got {level!r}"
            elif mode not in SLEEP_MODES:
                error = SleepErrorCode.INVALID, f"mode must be one of {SLEEP_MODES}, got {mode!r}"
        if error is not None:
            return self._sleep_refused(call_id, *error)
        if mode == "abort":
            await self._abort_all("aborted to sleep")
        return await self._sleep_call(Sleep(call_id=call_id, level=level, mode=mode))

    async def wake_up(self, tags: Sequence[str] | None = None) -> SleepReply:
        """Take the memory again (vLLM's LLM.wake_up): "weights" (level 1: as they were;
        level 2: to load into), "kv_cache" (empty, the same block count); none: both. Requests
        run again once nothing sleeps."""
        call_id = next(self._ids)
        error = self._sleep_refusal()
        unknown = [t for t in tags or () if t not in ALL_TAGS]
        if error is None and (unknown or isinstance(tags, str)):
            what = tags if isinstance(tags, str) else unknown[0]
            error = SleepErrorCode.INVALID, f"tags: {what!r} is not one of {list(ALL_TAGS)}"
        if error is not None:
            return self._sleep_refused(call_id, *error)
        woken = tuple(SleepTag(t) for t in tags or ())
        return await self._sleep_call(WakeUp(call_id=call_id, tags=woken))

    async def start_profile(
        self, *, record_shapes: bool = False, with_stack: bool = False
    ) -> ProfileReply:
        """Start the torch profiler in the executor's thread, between two steps (vLLM's and
        SGLang's /start_profile; EngineConfig.profiler_dir): requests run on, their steps
        recorded. The reply's `error` says why not (off, one running, disaggregation)."""
        command = StartProfile(
            call_id=next(self._ids), record_shapes=record_shapes, with_stack=with_stack
        )
        return await self._profile_call(command)

    async def stop_profile(self) -> ProfileReply:
        """Stop the profiler and write its trace (the reply's `trace_path`)."""
        return await self._profile_call(StopProfile(call_id=next(self._ids)))

    async def _profile_call(self, command: StartProfile | StopProfile) -> ProfileReply:
        if self._config.disaggregation != "none":
            message = "the profiler runs in one executor: not with disaggregation"
            code = ProfileErrorCode.UNSUPPORTED
            return ProfileReply(call_id=command.call_id, message=message, error=code)
        await self._send(command.call_id, command)
        reply = await self._wait(command.call_id)
        assert isinstance(reply, ProfileReply), reply
        return reply

    async def is_sleeping(self) -> bool:
        """vLLM's: whether anything sleeps (until wake_up brought every tag back)."""
        return self._sleep.is_sleeping

    def _sleep_refusal(self) -> tuple[SleepErrorCode, str] | None:
        config = self._config
        if not config.enable_sleep_mode:
            return SleepErrorCode.DISABLED, (
                "sleep mode is off: start the engine with enable_sleep_mode=True "
                "(--enable-sleep-mode)"
            )
        if config.tensor_parallel_size > 1 or config.disaggregation != "none":
            return SleepErrorCode.UNSUPPORTED, (
                "sleep mode runs one runner: not with tensor_parallel_size > 1 or disaggregation"
            )
        return None

    def _sleep_refused(self, call_id: int, code: SleepErrorCode, message: str) -> SleepReply:
        last = self._sleep
        return SleepReply(
            call_id=call_id, message=message, sleeping=last.sleeping, level=last.level, error=code
        )

    async def _sleep_call(self, command: Sleep | WakeUp) -> SleepReply:
        await self._send(command.call_id, command)
        reply = await self._wait(command.call_id)
        assert isinstance(reply, SleepReply), reply
        return reply

    async def _update(self, command: UpdateWeights, abort_all_requests: bool) -> WeightsUpdated:
        call_id = command.call_id
        self._updating = call_id  # until its reply, even if its caller leaves
        try:
            if abort_all_requests:
                await self._abort_all("aborted for a weight update")
            await self._send(call_id, command)
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

    async def _send(
        self, call_id: int, command: ResetPrefixCache | UpdateWeights | Sleep | WakeUp | ProfileCall
    ) -> None:
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
        if isinstance(reply, SleepReply):
            call_ids: tuple[int, ...] = (reply.call_id,)
            if reply.error is None or reply.error == SleepErrorCode.FAILED:
                self._sleep = reply  # the runner's state after it, whoever waits
            log.info("sleep call ended", success=reply.success, message=reply.message,
                     sleeping=[str(t) for t in reply.sleeping])  # fmt: skip
        elif isinstance(reply, WeightsUpdated):
            call_ids = (reply.call_id,)
            if self._updating == reply.call_id:
                self._updating = None
            log.info("weight update ended", success=reply.success, message=reply.message,
                     num_paused_requests=reply.num_paused_requests)  # fmt: skip
        elif isinstance(reply, ProfileReply):
            call_ids = (reply.call_id,)
            log.info("profile call ended", message=reply.message, error=reply.error)
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
