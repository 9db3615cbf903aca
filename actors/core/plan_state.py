"""The step planner's bookkeeping: request queues, the mirror of the allocator's block tables,
and applying the allocator's answer to build the executor's StepPlan.

The planner keeps an exact count of allocatable GPU blocks (free + cached) from each
AllocationResult, mirrors every request's block table with reference counts (it is the
allocator's only client), and reserves the upper bound for new requests (prefix-cache hits
only lower the need), so the allocator's grants do not fail. The policy that decides each
step's work lives in step_planner.py.
"""

from __future__ import annotations

import bisect

from troupe.actors.core.request_state import Request, Status
from troupe.messages.allocator import AllocOp
from troupe.messages.executor import SeqWork, StepPlan
from troupe.messages.scheduler import AllocationResult

# Kinds of planned entries; a running request's entry holds its block need (>= 0) instead.
NEW, SWAP_IN = -1, -2
PREEMPTION_MODES = ("auto", "swap", "recompute")


def _sort_key(req: Request) -> tuple[int, int]:
    return req.sort_key


class PlanState:
    """Request queues, block accounting and the allocator's answer (the StepPlanner's base)."""

    def __init__(
        self,
        *,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_prefix_caching: bool,
        preemption_mode: str,
        num_lookahead_tokens: int = 0,
    ) -> None:
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}; "
                f"got {preemption_mode!r}"
            )
        for name, value in (
            ("block_size", block_size),
            ("num_gpu_blocks", num_gpu_blocks),
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens must be >= 0, got {num_lookahead_tokens}")
        self.num_lookahead_tokens = num_lookahead_tokens
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.preemption_mode = preemption_mode
        self.requests: dict[str, Request] = {}  # every live (unfinished) request
        self.waiting: list[Request] = []  # each queue sorted by Request.sort_key
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        # Pool counts as of the last AllocationResult (exact), adjusted while planning.
        self.gpu_free = num_gpu_blocks
        self.gpu_cached = 0
        self.cpu_free = num_cpu_blocks
        self.prefix_cache_hit_tokens = 0
        self.prefix_cache_query_tokens = 0
        self.num_preemptions_swap = 0
        self.num_preemptions_recompute = 0
        self.step_id = 0
        self.in_flight: list[tuple[Request, int, bool]] = []  # (request, end pos, sample)
        self._refs: dict[int, int] = {}  # GPU block -> tables holding it (= allocator refs)
        self._to_free: dict[str, Request] = {}  # ended; the allocator still holds blocks
        self._to_commit: dict[str, Request] = {}  # computed new full blocks to cache
        self._released: list[str] = []  # ended; the executor still holds state
        self._unfittable: list[Request] = []
        self._ops: dict[type, list[AllocOp]] = {}
        self._planned: dict[str, tuple[Request, int, int]] = {}  # id -> (request, tokens, kind)
        self._swapped_out: dict[str, Request] = {}  # this step's swap-out victims
        self._avail = 0
        self._cpu_avail = 0
        self._preempted = False  # this step's planning preempted a request

    # -- queues ------------------------------------------------------------------------------

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @staticmethod
    def enqueue(queue: list[Request], req: Request) -> None:
        bisect.insort(queue, req, key=_sort_key)

    def _queue(self, status: Status) -> list[Request]:
        return {
            Status.WAITING: self.waiting,
            Status.RUNNING: self.running,
            Status.SWAPPED: self.swapped,
        }[status]

    def finish(self, req: Request) -> None:
        """End a request: out of its queue; blocks and executor state released next step."""
        if req.status == Status.FINISHED:
            return
        self._queue(req.status).remove(req)
        req.status = Status.FINISHED
        del self.requests[req.request_id]
        if req.in_allocator:
            self._to_free[req.request_id] = req
        if req.in_executor:
            self._released.append(req.request_id)

    def computed(self, req: Request, end: int) -> None:
        """The step computed the request's KV up to position `end`."""
        req.num_computed = end
        if self.enable_prefix_caching and end // self.block_size > req.num_committed_blocks:
            self._to_commit[req.request_id] = req

    def take_unfittable(self) -> list[Request]:
        out, self._unfittable = self._unfittable, []
        return out

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped or self._to_free)

    # -- bookkeeping shared with the policy -------------------------------------------------

    def _release(self, table: list[int]) -> int:
        """Drop the table's references; how many blocks become allocatable."""
        refs, freed = self._refs, 0
        for block_id in table:
            left = refs[block_id] - 1
            if left:
                refs[block_id] = left
            else:
                del refs[block_id]
                freed += 1
        return freed

    def _op(self, op: AllocOp) -> None:
        self._ops.setdefault(type(op), []).append(op)

    def _to_recompute(self, req: Request) -> None:
        req.in_allocator = False
        req.num_computed = req.num_committed_blocks = req.num_cpu_blocks = 0
        req.status = Status.WAITING
        self.enqueue(self.waiting, req)

    # -- the allocator's answer --------------------------------------------------------------

    def build_plan(self, result: AllocationResult) -> StepPlan | None:
        """Apply grants and denials; the StepPlan (None when there is nothing to send)."""
        self.gpu_free, self.gpu_cached = result.num_gpu_free, result.num_gpu_cached
        self.cpu_free = result.num_cpu_free
        self.prefix_cache_hit_tokens = result.prefix_cache_hit_tokens
        self.prefix_cache_query_tokens = result.prefix_cache_query_tokens
        planned = self._planned
        for rid in result.swap_failed:  # no CPU room after all: it was freed, so recompute
            req = self._swapped_out[rid]
            req.in_allocator = False
            if req.status == Status.SWAPPED:
                self.swapped.remove(req)
                self._to_recompute(req)
                self.num_preemptions_swap -= 1
                self.num_preemptions_recompute += 1
        added: dict[str, tuple[int, ...]] = {}
        refs = self._refs
        for grant in result.grants:
            req, _, kind = planned[grant.request_id]
            for block_id in grant.block_ids:
                refs[block_id] = refs.get(block_id, 0) + 1
            if kind >= 0:  # growing a running request
                req.table.extend(grant.block_ids)
                added[grant.request_id] = grant.block_ids
            else:
                req.table = list(grant.block_ids)
                req.num_cpu_blocks = 0
            if kind == NEW:
                req.num_computed = grant.num_cached_tokens
                req.num_committed_blocks = grant.num_cached_tokens // self.block_size
                if req.num_tokens == req.prompt_len:  # first start, not a recompute
                    req.num_cached_tokens = grant.num_cached_tokens
        for rid in result.denied:
            req, _, kind = planned.pop(rid)
            if req.status != Status.RUNNING:
                if kind == NEW:
                    req.in_allocator = False
                continue
            if kind == NEW:
                self.running.remove(req)
                req.in_allocator = False
                req.status = Status.WAITING
                self.enqueue(self.waiting, req)
            elif kind == SWAP_IN:
                self.running.remove(req)
                req.status = Status.SWAPPED
                self.enqueue(self.swapped, req)
        seqs: list[SeqWork] = []
        in_flight: list[tuple[Request, int, bool]] = []
        running = Status.RUNNING
        add_seq, add_in_flight, get_added = seqs.append, in_flight.append, added.get
        for req, n, _ in planned.values():
            if req.status != running:
                continue  # ended while the allocator worked
            start = req.num_computed
            tokens = req.token_ids
            num_tokens = len(tokens)
            if n == 1 and start == num_tokens - 1 and req.in_executor and not req.needs_reset:
                # The hot path: a decode (kw-only construction is the dominant cost here).
                rid = req.request_id
                add_seq(
                    SeqWork(
                        request_id=rid,
                        token_ids=(tokens[start],),
                        start_pos=start,
                        block_ids=get_added(rid, ()),
                    )
                )
                add_in_flight((req, num_tokens, True))
                continue
            end = min(num_tokens, start + n)
            sample = end == num_tokens
            first = not req.in_executor
            seqs.append(
                SeqWork(
                    request_id=req.request_id,
                    token_ids=tuple(tokens[start:end]),
                    start_pos=start,
                    block_ids=tuple(req.table)
                    if req.needs_reset
                    else added.get(req.request_id, ()),
                    reset=req.needs_reset,
                    sample=sample,
                    params=req.params if first else None,
                    num_prompt_tokens=req.prompt_len if first else 0,
                )
            )
            req.in_executor = True
            req.needs_reset = False
            in_flight.append((req, end, sample))
        self._planned = {}
        self.in_flight = in_flight
        if not seqs and not result.swap_out and not result.swap_in:
            return None
        released, self._released = tuple(self._released), []
        return StepPlan(
            step_id=result.step_id,
            seqs=tuple(seqs),
            swap_out=result.swap_out,
            swap_in=result.swap_in,
            released=released,
        )
