"""The scheduler's policy: which requests run each step, with which blocks, and who is
preempted when blocks run out.

Order of a step's token budget (max_num_batched_tokens) and seats (max_num_seqs):

    1. running decodes (one token each), in priority order
    2. running prefills, in chunks of what budget is left (a long prompt never stalls decodes)
    3. swapped requests, resumed before any new request is admitted
    4. waiting requests (new, or preempted for recompute), in priority order, FCFS within one

When a running request needs a block and none is free, the last running request in priority
order (lowest priority, latest arrival) is preempted: swapped to CPU if the mode allows and the
CPU pool has room, else freed for recompute. No new request is admitted in a step that
preempted, so a preempted request is never overtaken by later arrivals of its priority.
Queues, block accounting and the allocator's answer live in plan_state.py.

Lookahead (num_lookahead_tokens = k > 0): a decoding request's table covers k positions past
its tokens, so an executor that speculates the next decode step already owns the block it
writes (see gpu/model_runner.py). Decodes and sampled prefill chunks grow to that cover, and the
extra blocks count in the free-block accounting and preemption like any other need. New
requests get it at their first decode: AllocateNew never covers past the prompt.

    tokens  t0 .. t9 | t10 (to compute)   block_size 4, k = 1
    table   [b0 b1 b2]  covers 12 >= 11 + 1 positions: the next step's KV slot is owned
"""

from __future__ import annotations

from troupe.actors.core.plan_state import NEW, SWAP_IN, PlanState
from troupe.actors.core.request_state import Request, Status
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    AllocOp,
    CacheBlocks,
    FreeRequest,
    Grow,
    SwapIn,
    SwapOut,
)


class StepPlanner(PlanState):
    """Step planning: which requests run, who is preempted (the SchedulerCore's base)."""

    # -- planning ----------------------------------------------------------------------------

    def plan_allocation(self) -> AllocateBatch | None:
        """Decide this step's work; the allocator ops it needs (None: nothing to do)."""
        bs = self.block_size
        self._ops = {}
        self._planned = {}
        self._swapped_out = {}
        self._avail, self._cpu_avail = self.gpu_free, self.cpu_free
        for req in self._to_commit.values():
            num_full = req.num_computed // bs
            if req.in_allocator and num_full > req.num_committed_blocks:
                tokens = tuple(req.token_ids[req.num_committed_blocks * bs : num_full * bs])
                self._op(CacheBlocks(req.request_id, tokens))
                req.num_committed_blocks = num_full
        self._to_commit = {}
        for req in self._to_free.values():
            if req.in_allocator:
                self._op(FreeRequest(req.request_id))
                self._avail += self._release(req.table)
                self._cpu_avail += req.num_cpu_blocks
                req.table, req.num_cpu_blocks, req.in_allocator = [], 0, False
        self._to_free = {}

        budget = self.max_num_batched_tokens
        self._preempted = False
        planned = self._planned
        growing: list[Request] = []  # planned with a block need, in plan order (for Grow ops)
        prefills: list[Request] = []
        running = Status.RUNNING
        avail = self._avail
        lookahead = self.num_lookahead_tokens
        # Decodes first, in priority order; prefills after, with what budget is left. Iterate a
        # snapshot: preemption removes victims from self.running while this loop runs.
        for req in list(self.running):
            if budget == 0:
                break
            if req.status != running:
                continue  # preempted earlier in this loop
            computed = req.num_computed
            if len(req.token_ids) - computed != 1:
                prefills.append(req)
                continue
            # The hot path: a decode is one token and needs a new block only at a boundary
            # (its table covers computed + 1 + lookahead positions after this step).
            if computed + lookahead < len(req.table) * bs:
                planned[req.request_id] = (req, 1, 0)
                budget -= 1
                continue
            need = self.blocks_for(computed + 1 + lookahead) - len(req.table)
            if avail >= need:
                planned[req.request_id] = (req, 1, need)
                growing.append(req)
                budget -= 1
                avail -= need
            else:
                self._avail = avail
                budget = self._fit(req, 1, need, budget, growing)
                avail = self._avail
        self._avail = avail
        for req in prefills:
            if budget == 0:
                break
            if req.status != running:
                continue  # preempted earlier in this loop
            n = min(len(req.token_ids) - req.num_computed, budget)
            need = self.blocks_for(req.num_computed + n + self._lookahead(req, n)) - len(req.table)
            need = max(need, 0)
            if need > self._avail:
                # A prefill chunk shrinks to the blocks there are before preempting (a last chunk
                # that fits only without its lookahead keeps its length and goes without).
                fit = (len(req.table) + self._avail) * bs - req.num_computed
                if fit >= 1:
                    n = min(n, fit)
                    need = max(self.blocks_for(req.num_computed + n) - len(req.table), 0)
            budget = self._fit(req, n, need, budget, growing)
        for req in growing:
            entry = planned.get(req.request_id)
            if entry is not None:  # not undone by a later preemption
                self._op(Grow(req.request_id, self._cover(req, entry[1], entry[2])))
        if not self._preempted:
            budget = self._resume_swapped(budget)
            if not self.swapped:
                self._admit_waiting(budget)
        ops: list[AllocOp] = []
        for kind in (CacheBlocks, FreeRequest, SwapOut, SwapIn, Grow, AllocateNew):
            ops.extend(self._ops.get(kind, ()))
        if not ops and not planned:
            return None
        self.step_id += 1
        return AllocateBatch(step_id=self.step_id, ops=tuple(ops))

    def _lookahead(self, req: Request, n: int) -> int:
        """Positions past the chunk its table must cover: the lookahead if the chunk samples."""
        return self.num_lookahead_tokens if req.num_computed + n == req.num_tokens else 0

    def _cover(self, req: Request, n: int, need: int) -> int:
        """Tokens the table covers after granting `need` blocks for an `n`-token chunk (a Grow's
        num_tokens): the chunk plus its lookahead, capped at what `need` was counted for."""
        end = req.num_computed + n
        if not self.num_lookahead_tokens:
            return end
        return min(end + self._lookahead(req, n), (len(req.table) + need) * self.block_size)

    def _fit(self, req: Request, n: int, need: int, budget: int, growing: list[Request]) -> int:
        """Plan `n` tokens of a running request that needs `need` more blocks, preempting from
        the back of the running queue until they fit; the budget left."""
        planned = self._planned
        while need > self._avail:
            victim = self.running[-1]
            self._preempted = True
            if victim is req:
                if len(self.running) == 1:  # alone and still short: it can never fit
                    self._drop_unfittable(req)
                else:
                    self._preempt(req)
                return budget
            undone = planned.pop(victim.request_id, None)
            if undone is not None:  # planned earlier this step: give its share back
                budget += undone[1]
                self._avail += undone[2]
            self._preempt(victim)
        planned[req.request_id] = (req, n, need)
        if need > 0:
            growing.append(req)
        self._avail -= need
        return budget - n

    def _preempt(self, req: Request) -> None:
        """Take a running request off the GPU: swap it out, or free it for recompute."""
        self.running.remove(req)
        num_blocks = len(req.table)
        self._avail += self._release(req.table)
        req.table = []
        req.needs_reset = True
        swap = self.preemption_mode != "recompute" and 0 < num_blocks <= self._cpu_avail
        if swap:  # mode "swap" without CPU room falls back to recompute: nothing else can run
            self._op(SwapOut(req.request_id))
            self._swapped_out[req.request_id] = req
            self._cpu_avail -= num_blocks
            req.num_cpu_blocks = num_blocks
            req.status = Status.SWAPPED
            self.enqueue(self.swapped, req)
            self.num_preemptions_swap += 1
        else:
            self._op(FreeRequest(req.request_id))
            self._to_recompute(req)
            self.num_preemptions_recompute += 1

    def _drop_unfittable(self, req: Request) -> None:
        """End a request that needs more blocks than the pool has; free it in this batch."""
        self.finish(req)
        self._to_free.pop(req.request_id, None)
        self._op(FreeRequest(req.request_id))
        self._avail += self._release(req.table)
        req.table, req.in_allocator = [], False
        self._unfittable.append(req)

    def _resume_swapped(self, budget: int) -> int:
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.swapped[0]
            n = min(req.num_tokens - req.num_computed, budget)
            cover = req.num_computed + n + self._lookahead(req, n)
            total = max(req.num_cpu_blocks, self.blocks_for(cover))
            if total > self._avail:
                break
            self.swapped.pop(0)
            self._op(SwapIn(req.request_id, cover))
            self._avail -= total
            req.status = Status.RUNNING
            self.enqueue(self.running, req)
            self._planned[req.request_id] = (req, n, SWAP_IN)
            budget -= n
        return budget

    def _admit_waiting(self, budget: int) -> None:
        if not self.waiting or budget <= 0 or len(self.running) >= self.max_num_seqs:
            return
        bs = self.block_size
        # First blocks of prompts being prefilled: a request starting the same way waits until
        # that prefill is done and cached, so a shared prefix is computed once, not per request.
        leaders: set[tuple[int, ...]] = set()
        if self.enable_prefix_caching:
            leaders = {
                tuple(r.token_ids[:bs])
                for r in self.running
                if r.num_computed < r.prompt_len and r.prompt_len > bs
            }
        deferred: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            num_tokens = req.num_tokens
            if self.blocks_for(num_tokens) > self.num_gpu_blocks:
                self.finish(req)  # grew past the pool while preempted
                self._unfittable.append(req)
                continue
            if self.enable_prefix_caching and num_tokens > bs:
                head = tuple(req.token_ids[:bs])
                if head in leaders:
                    deferred.append(self.waiting.pop(0))
                    continue
                leaders.add(head)
            n = min(num_tokens, budget)
            max_hit = (num_tokens - 1) // bs * bs if self.enable_prefix_caching else 0
            upper = self.blocks_for(min(num_tokens, max_hit + n))
            if upper > self._avail:
                break
            self.waiting.pop(0)
            self._op(AllocateNew(req.request_id, tuple(req.token_ids), n))
            self._avail -= upper
            req.status = Status.RUNNING
            req.in_allocator = True
            self.enqueue(self.running, req)
            self._planned[req.request_id] = (req, n, NEW)
            budget -= n
        for req in deferred:
            self.enqueue(self.waiting, req)
