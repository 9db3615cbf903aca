"""Scheduler core: owns every request's state, plans each step, turns results into tokens.

Each step is one round trip to the allocator, then one to the executor:

    idle --(work exists)--> schedule(): AllocateBatch --> allocator
         <-- AllocationResult: on_allocated(): StepPlan --> executor (nothing to run: idle)
         <-- StepResult: update(): TokenBatch --> streamer; next round trip if work exists

Messages arriving meanwhile (new requests, aborts, stop-string hits) take effect at the next plan;
late tokens (disaggregation: a first token after its step's result) land at once (late_tokens.py).
The engine's calls (a prefix-cache reset, a weight update: engine_calls.py) ride the same loop.
Composed of RequestQueues, StepPlanner, build_plan, apply_tokens and a Speculator, a module each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec
import structlog
from troupe.actors.core.base import Outgoing
from troupe.actors.core.engine_calls import EngineCalls
from troupe.actors.core.grammar_feed import GrammarFeed
from troupe.actors.core.kv_release import too_big, unfit
from troupe.actors.core.late_tokens import land_tokens
from troupe.actors.core.plan_builder import InFlight, build_plan
from troupe.actors.core.request_queues import RequestQueues
from troupe.actors.core.request_state import Request
from troupe.actors.core.row_failures import fail_rows
from troupe.actors.core.scheduler_stats import engine_stats
from troupe.actors.core.scheduler_step_facts import StepFacts
from troupe.actors.core.speculator import SpecSettings, Speculator
from troupe.actors.core.step_limits import StepLimits
from troupe.actors.core.step_planner import StepPlanner
from troupe.actors.core.step_tokens import apply_tokens
from troupe.messages.allocator import AllocateBatch, DropCachedBlocks
from troupe.messages.common import FinishReason
from troupe.messages.engine_calls import ResetPrefixCache, UpdateWeights, WeightsLoaded
from troupe.messages.events import EngineStats
from troupe.messages.executor import StepPlan
from troupe.messages.pooling import Pooled
from troupe.messages.profile_calls import ProfileReply, StartProfile, StopProfile
from troupe.messages.scheduler import (
    AdmittedRequest,
    AllocationResult,
    LateTokens,
    PromptLogprobs,
    SchedulerInbox,
    StepResult,
    StopRequests,
)
from troupe.messages.sleep_calls import Sleep, SleepDone, WakeUp
from troupe.messages.streamer import SeqOutput, TokenBatch
from troupe.messages.tokenizer import AbortRequest
from troupe.policies.preemption import make_preemption_policy
from troupe.policies.queue import make_queue_policy

log = structlog.get_logger("troupe.scheduler")
# updating: the executor runs an engine call (weights, sleep, wake_up: engine_calls.py)
Phase = Literal["idle", "allocating", "stepping", "updating"]
ABORT, ERROR = FinishReason.ABORT, FinishReason.ERROR


class SchedulerCore:
    """Inbox: AdmittedRequest, AbortRequest, StopRequests, AllocationResult, StepResult, LateTokens,
    and the engine's calls (ResetPrefixCache, UpdateWeights, Sleep, WakeUp, StartProfile,
    StopProfile; WeightsLoaded, SleepDone and ProfileReply from the executor). Outboxes:
    "allocator" (AllocateBatch), "executor" (StepPlan, UpdateWeights, Sleep, WakeUp, the
    profile calls), "streamer"
    (TokenBatch), "grammar" (ComputeMasks, for steps that sample constrained requests:
    grammar_feed.py), "engine" (the engine calls' replies: engine_calls.py).

    Every request gets exactly one terminal SeqOutput (STOP/LENGTH/ABORT/ERROR), except those
    ended by a stop string: the streamer already told the client, so StopRequests only frees.
    """

    def __init__(
        self,
        limits: StepLimits,
        *,
        num_cpu_blocks: int,
        preemption_mode: str = "auto",
        scheduling_policy: str = "priority",
        eos_token_ids: Iterable[int] = (),
        speculative: SpecSettings | None = None,
        hold_last_prompt_token: bool = False,
    ) -> None:
        self.limits, self.num_cpu_blocks = limits, num_cpu_blocks
        self.queues = RequestQueues(make_queue_policy(scheduling_policy))
        self.speculator = Speculator(speculative or SpecSettings())
        # held_token.py; not with speculation: proposals to verify run as steps of their own
        self.planner = StepPlanner(
            limits, self.queues, make_preemption_policy(preemption_mode), self.speculator,
            hold_last=hold_last_prompt_token and not self.speculator.enabled,
        )  # fmt: skip
        # The allocator's counts as of its last answer: what the next plan starts from.
        self.pools = AllocationResult(
            step_id=0, num_gpu_free=self.limits.num_gpu_blocks, num_cpu_free=num_cpu_blocks
        )
        self.requests = self.queues.requests  # every live request, by id
        self.eos_token_ids = frozenset(eos_token_ids)
        self.phase: Phase = "idle"
        self.step_id = self.num_steps = self._num_arrivals = 0
        self.in_flight: list[InFlight] = []
        self.grammar = GrammarFeed()
        self._pending: list[SeqOutput] = []  # terminal outputs from outside a step
        self._time = 0.0  # latest time seen in a message (TokenBatch.time outside steps)
        self.calls = EngineCalls()  # the engine's calls, and the requests they hold aside
        self.facts = StepFacts()  # first-scheduled times and tokens per step, for metrics

    def handle(self, batch: Sequence[SchedulerInbox]) -> Outgoing:
        out: Outgoing = []
        is_held = False  # a request held aside: the stats show it waiting
        for msg in batch:
            match msg:
                case AdmittedRequest():
                    if self.calls.hold(msg):
                        is_held = True
                    else:
                        self.add(msg)
                case AbortRequest():
                    self.abort(msg.request_id, msg.reason)
                case StopRequests():  # the streamer has ended them: free them silently
                    for request_id in msg.request_ids:
                        self.abort(request_id, None)
                case AllocationResult():
                    out += [("engine", reply) for reply in self.calls.dropped(msg.cache_dropped)]
                    if (plan := self.on_allocated(msg)) is not None:
                        plan, masks = self.grammar.feed(plan, self.in_flight)
                        if masks is not None:  # computed while the executor runs the plan
                            out.append(("grammar", masks))
                    # Nothing to run (a free-only round trip): publish the fresh stats anyway.
                    out.append(("executor", plan) if plan else ("streamer", self.stats_batch()))
                    for held in self.calls.release():  # a weight update ended: they start
                        self.add(held)
                case StepResult():
                    out.append(("streamer", self.update(msg)))
                case LateTokens():  # disaggregation: tokens of an earlier step (late_tokens.py)
                    self._time = max(self._time, msg.time)
                    self._pending += land_tokens(msg, self.queues)
                case ResetPrefixCache():
                    self.calls.reset(msg)
                case StartProfile() | StopProfile():  # the executor takes it between steps
                    out.append(("executor", msg))
                case ProfileReply():
                    out.append(("engine", msg))
                case UpdateWeights() | Sleep() | WakeUp():
                    if (refused := self.calls.begin(msg, self.requests.keys())) is not None:
                        out.append(("engine", refused))
                case WeightsLoaded() | SleepDone():
                    if self.phase != "updating":
                        raise ValueError(f"scheduler: {type(msg).__name__} while {self.phase}")
                    self.phase = "idle"
                    if (reply := self.calls.loaded(msg)) is not None:  # nothing was copied
                        out.append(("engine", reply))
                        for held in self.calls.release():
                            self.add(held)
                case _:
                    raise ValueError(f"scheduler: unexpected message {type(msg).__name__}")
        if self._pending or is_held:
            out.append(("streamer", self.stats_batch()))
        if self.phase == "idle":
            if (update := self.calls.to_load(len(self.requests))) is not None:
                self.phase = "updating"  # no request left, no step out: the weights change
                out.append(("executor", update))
            elif (request := self.schedule()) is not None:
                out.append(("allocator", request))
        return out

    def add(self, msg: AdmittedRequest) -> None:
        """Queue a new request (duplicates of a live id are ignored: admission prevents them).
        One that makes this raise (malformed past the edge) fails alone: a request is recorded
        only once it is queued, so there is nothing to undo."""
        try:
            self._time = max(self._time, msg.arrival_time)
            if msg.request_id in self.requests:
                return
            self._num_arrivals += 1
            req = Request.admit(msg, self._num_arrivals, self.eos_token_ids)
            if (error := unfit(self.limits, req)) is not None:
                self._pending.append(req.failed(error))
            else:
                for queued in self.planner.forks.add(req):  # itself, or its samples (n > 1)
                    self.planner.add(queued)
                self.grammar.active |= req.params.structured_outputs is not None
        except Exception as exc:
            log.exception("scheduler failed on a request", request_id=msg.request_id)
            if msg.request_id not in self.requests:  # else a duplicate: the live one goes on
                message = f"scheduler failed on this request: {type(exc).__name__}: {exc}"
                self._pending.append(SeqOutput(msg.request_id, (), ERROR, error=message))

    def abort(self, request_id: str, reason: str | None = "aborted") -> None:
        """End a request wherever it is (reason None: silently); unknown ids are ignored (races)."""
        if self.calls.held.pop(request_id, None) is not None:  # held aside by an engine call
            cached = 0
        elif (req := self.requests.get(request_id)) is not None:
            self.queues.finish(req)
            cached = req.num_cached_tokens
        elif self.planner.forks.abort(request_id, self.queues):  # a forked request's samples
            cached = 0
        else:
            return
        if reason is not None:  # under a parent's id: the streamer ends each open sample
            self._pending.append(SeqOutput(request_id, (), ABORT, None, None, cached, reason))

    def schedule(self) -> AllocateBatch | None:
        """Plan the next step's allocation; None if there is nothing to do."""
        if self.phase != "idle":
            raise ValueError(f"scheduler: cannot schedule while {self.phase}")
        ops = self.planner.plan(self.pools.num_gpu_free, self.pools.num_cpu_free)
        self._pending.extend(r.failed(too_big(self.limits, r)) for r in self.planner.unfittable)
        self.planner.unfittable = []
        drop = (DropCachedBlocks(),) if self.calls.take_drop() else ()  # last: frees dropped too
        if ops is None and not drop:
            return None
        self.phase, self.step_id = "allocating", self.step_id + 1
        return AllocateBatch(step_id=self.step_id, ops=(*(ops or ()), *drop))

    def on_allocated(self, result: AllocationResult) -> StepPlan | None:
        """Apply the allocator's answer; the step to run, or None (idle) if nothing runs."""
        self._check_phase("allocating", result.step_id, "AllocationResult")
        self.pools = result
        plan, self.in_flight = build_plan(self.planner, result)
        self.phase = "stepping" if plan is not None else "idle"
        if plan is not None:
            self.facts.on_plan(plan, (req for req, _, _ in self.in_flight), self._time)
        return plan

    def update(self, result: StepResult) -> TokenBatch:
        """Apply a step's sampled tokens; the TokenBatch for the streamer."""
        self._check_phase("stepping", result.step_id, "StepResult")
        self.phase = "idle"
        self.num_steps += 1
        self._time = max(self._time, result.time)
        if result.error is not None or result.failed:  # rows without a token: row_failures.py
            self._pending += fail_rows(result, self.in_flight, self.queues)
        if result.error is None:
            apply_tokens(result, self.in_flight, self.planner, self._pending)
        self.in_flight = []
        return self.stats_batch(result.prompt_logprobs, result.embeddings)

    def stats(self) -> EngineStats:
        """A snapshot of pools (as of the last AllocationResult), queues and counters."""
        stats = engine_stats(
            self.pools, self.planner, self.num_cpu_blocks, self.num_steps, self.facts
        )
        if self.calls.held:  # held aside by an engine call or a sleep: they wait too
            return msgspec.structs.replace(
                stats, num_waiting=stats.num_waiting + len(self.calls.held)
            )
        return stats

    def stats_batch(
        self, prompt_logprobs: tuple[PromptLogprobs, ...] = (), embeddings: tuple[Pooled, ...] = ()
    ) -> TokenBatch:
        """Pending outputs (maybe none) and fresh stats: a step's (with the prompt logprobs and
        embeddings it computed), or news between steps."""
        outputs, self._pending = tuple(self._pending), []
        stats = self.stats()
        return TokenBatch(
            step_id=self.step_id,
            time=self._time,
            outputs=outputs,
            stats=stats,
            prompt_logprobs=prompt_logprobs,
            embeddings=embeddings,
            first_scheduled=self.facts.take_scheduled(),
        )

    def _check_phase(self, phase: Phase, step_id: int, what: str) -> None:
        if self.phase != phase or step_id != self.step_id:
            raise ValueError(
                f"scheduler: {what} for step {step_id} while {self.phase} step {self.step_id}"
            )
