"""Scheduler core: owns every request's state, plans each step, turns results into tokens.

Each step is one round trip to the allocator, then one to the executor:

    idle --(work exists)--> schedule(): AllocateBatch --> allocator
         <-- AllocationResult: on_allocated(): StepPlan --> executor (nothing to run: idle)
         <-- StepResult: update(): TokenBatch --> streamer; next round trip if work exists

Messages arriving meanwhile (new requests, aborts, stop-string hits) change the state and take
effect at the next plan. Planning policy lives in step_planner.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from troupe.actors.core.base import Outgoing
from troupe.actors.core.request_state import Request, Status
from troupe.actors.core.step_planner import StepPlanner
from troupe.messages.allocator import AllocateBatch
from troupe.messages.common import FinishReason
from troupe.messages.events import EngineStats
from troupe.messages.executor import StepPlan
from troupe.messages.scheduler import (
    AdmittedRequest,
    AllocationResult,
    SampledToken,
    SchedulerInbox,
    StepResult,
    StopRequests,
)
from troupe.messages.streamer import SeqOutput, TokenBatch
from troupe.messages.tokenizer import AbortRequest

Phase = Literal["idle", "allocating", "stepping"]


class SchedulerCore(StepPlanner):
    """Inbox: AdmittedRequest, AbortRequest, StopRequests, AllocationResult, StepResult.
    Outboxes: "allocator" (AllocateBatch), "executor" (StepPlan), "streamer" (TokenBatch).

    Every request gets exactly one terminal SeqOutput (STOP/LENGTH/ABORT/ERROR), except those
    ended by a stop string: the streamer already told the client, so StopRequests only frees.
    """

    def __init__(
        self,
        *,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_prefix_caching: bool = True,
        preemption_mode: str = "auto",
        eos_token_ids: Iterable[int] = (),
        num_lookahead_tokens: int = 0,
    ) -> None:
        super().__init__(
            block_size=block_size,
            num_gpu_blocks=num_gpu_blocks,
            num_cpu_blocks=num_cpu_blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
            preemption_mode=preemption_mode,
            num_lookahead_tokens=num_lookahead_tokens,
        )
        self.eos_token_ids = frozenset(eos_token_ids)
        self.phase: Phase = "idle"
        self._num_arrivals = 0
        self._pending: list[SeqOutput] = []  # terminal outputs from outside a step
        self._time = 0.0  # latest time seen in a message (TokenBatch.time outside steps)
        self.num_steps = 0

    # -- the actor interface -----------------------------------------------------------------

    def handle(self, batch: Sequence[SchedulerInbox]) -> Outgoing:
        out: Outgoing = []
        for msg in batch:
            match msg:
                case AdmittedRequest():
                    self.add(msg)
                case AbortRequest():
                    self.abort(msg.request_id, msg.reason)
                case StopRequests():
                    for request_id in msg.request_ids:
                        self.stop(request_id)
                case AllocationResult():
                    plan = self.on_allocated(msg)
                    # Nothing to run (a free-only round trip): publish the fresh stats anyway.
                    out.append(("executor", plan) if plan else ("streamer", self.stats_batch()))
                case StepResult():
                    out.append(("streamer", self.update(msg)))
                case _:
                    raise ValueError(f"scheduler: unexpected message {type(msg).__name__}")
        if self._pending:
            out.append(("streamer", self.stats_batch()))
        if self.phase == "idle":
            request = self.schedule()
            if request is not None:
                out.append(("allocator", request))
        return out

    # -- inbox events ------------------------------------------------------------------------

    def add(self, msg: AdmittedRequest) -> None:
        """Queue a new request (duplicates of a live id are ignored: admission prevents them)."""
        self._time = max(self._time, msg.arrival_time)
        if msg.request_id in self.requests:
            return
        self._num_arrivals += 1
        req = Request(msg, self._num_arrivals, self.eos_token_ids)
        need = self.blocks_for(req.num_tokens)
        if need > self.num_gpu_blocks or not req.token_ids:
            self._pending.append(self._fail_output(req, self._too_big(req)))
            return
        self.requests[req.request_id] = req
        self.enqueue(self.waiting, req)

    def abort(self, request_id: str, reason: str = "aborted") -> None:
        """End a request wherever it is; unknown ids are ignored (races are normal)."""
        req = self.requests.get(request_id)
        if req is not None:
            self.finish(req)
            self._pending.append(
                SeqOutput(
                    request_id, (), FinishReason.ABORT, None, None, req.num_cached_tokens, reason
                )
            )

    def stop(self, request_id: str) -> None:
        """A stop string matched: the streamer has ended it; free it silently."""
        req = self.requests.get(request_id)
        if req is not None:
            self.finish(req)

    def on_allocated(self, result: AllocationResult) -> StepPlan | None:
        """Apply the allocator's answer; the step to run, or None (idle) if nothing runs."""
        if self.phase != "allocating" or result.step_id != self.step_id:
            raise ValueError(
                f"scheduler: AllocationResult for step {result.step_id} while {self.phase} "
                f"step {self.step_id}"
            )
        plan = self.build_plan(result)
        self.phase = "stepping" if plan is not None else "idle"
        return plan

    def schedule(self) -> AllocateBatch | None:
        """Plan the next step's allocation; None if there is nothing to do."""
        if self.phase != "idle":
            raise ValueError(f"scheduler: cannot schedule while {self.phase}")
        batch = self.plan_allocation()
        if batch is not None:
            self.phase = "allocating"
        for req in self.take_unfittable():
            self._pending.append(self._fail_output(req, self._too_big(req)))
        return batch

    def update(self, result: StepResult) -> TokenBatch:
        """Apply a step's sampled tokens; the TokenBatch for the streamer."""
        if self.phase != "stepping" or result.step_id != self.step_id:
            raise ValueError(
                f"scheduler: StepResult for step {result.step_id} while {self.phase} "
                f"step {self.step_id}"
            )
        self.phase = "idle"
        self.num_steps += 1
        self._time = max(self._time, result.time)
        outputs = self._pending
        self._pending = []
        if result.error is not None:
            for req, _, _ in self.in_flight:
                if req.status != Status.FINISHED:  # not aborted or stopped mid-step
                    self.finish(req)
                    outputs.append(self._fail_output(req, f"step failed: {result.error}"))
        else:
            self._apply_tokens(result.sampled, outputs)
        self.in_flight = []
        return TokenBatch(
            step_id=result.step_id, time=self._time, outputs=tuple(outputs), stats=self.stats()
        )

    def _apply_tokens(self, sampled: Sequence[SampledToken], outputs: list[SeqOutput]) -> None:
        """Append each in-flight request's sampled token; its SeqOutput goes to `outputs`."""
        # Tokens come in plan order; a dict is built only if the executor broke that order.
        by_id: dict[str, SampledToken] | None = None
        i = 0
        num_sampled = len(sampled)
        bs = self.block_size
        caching = self.enable_prefix_caching
        to_commit = self._to_commit
        finished = Status.FINISHED
        append = outputs.append
        for req, end, sample in self.in_flight:
            if sample:
                i += 1
            if req.status == finished:
                continue  # aborted or stopped mid-step: its KV and token are not wanted
            req.num_computed = end
            rid = req.request_id
            if caching and end // bs > req.num_committed_blocks:
                to_commit[rid] = req
            if not sample:
                continue
            if by_id is None and i <= num_sampled and (token := sampled[i - 1]).request_id == rid:
                pass
            else:
                by_id = by_id or {s.request_id: s for s in sampled}
                found = by_id.get(rid)
                if found is None:
                    self.finish(req)
                    append(self._fail_output(req, "the executor returned no token for it"))
                    continue
                token = found
            token_id = token.token_id
            tokens = req.token_ids
            tokens.append(token_id)
            logprobs = None if token.logprob is None else (token.logprob,)
            if token_id in req.stop_ids:
                self.finish(req)
                append(
                    SeqOutput(
                        rid,
                        (token_id,),
                        FinishReason.STOP,
                        token_id,
                        logprobs,
                        req.num_cached_tokens,
                    )
                )
            elif len(tokens) >= req.max_total_tokens:
                self.finish(req)
                append(
                    SeqOutput(
                        rid, (token_id,), FinishReason.LENGTH, None, logprobs, req.num_cached_tokens
                    )
                )
            else:
                append(SeqOutput(rid, (token_id,), None, None, logprobs, req.num_cached_tokens))

    # -- outputs -----------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """A snapshot of pools (as of the last AllocationResult), queues and counters."""
        return EngineStats(
            num_gpu_blocks=self.num_gpu_blocks,
            num_gpu_blocks_used=self.num_gpu_blocks - self.gpu_free,
            num_gpu_blocks_cached=self.gpu_cached,
            num_cpu_blocks=self.num_cpu_blocks,
            num_cpu_blocks_used=self.num_cpu_blocks - self.cpu_free,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_swapped=len(self.swapped),
            num_preemptions_swap=self.num_preemptions_swap,
            num_preemptions_recompute=self.num_preemptions_recompute,
            prefix_cache_hit_tokens=self.prefix_cache_hit_tokens,
            prefix_cache_query_tokens=self.prefix_cache_query_tokens,
            num_steps=self.num_steps,
        )

    def stats_batch(self) -> TokenBatch:
        """Pending terminal outputs (maybe none) and fresh stats, outside a step."""
        outputs, self._pending = tuple(self._pending), []
        return TokenBatch(
            step_id=self.step_id, time=self._time, outputs=outputs, stats=self.stats()
        )

    def _too_big(self, req: Request) -> str:
        need = self.blocks_for(req.num_tokens)
        return (
            f"request needs {need} KV blocks of {self.block_size} tokens for its "
            f"{req.num_tokens} tokens, but the GPU pool holds only {self.num_gpu_blocks} "
            f"(num_kv_blocks)"
        )

    @staticmethod
    def _fail_output(req: Request, message: str) -> SeqOutput:
        return SeqOutput(
            req.request_id, (), FinishReason.ERROR, None, None, req.num_cached_tokens, message
        )
