"""The step planner: who runs each step, with how many blocks, and who gives way when blocks run
out. It emits the step's allocator ops and one typed entry (Work) per request. The budget goes to
running decodes, then running prefills in chunks (a long prompt never stalls decodes), each in queue
order; then to swapped and waiting requests (step_starts.py).

Lookahead: step_limits.py (a new request gets it at its first decode); a prompt joining decodes
may hold its last token back (held_token.py). Speculative decoding: a decode's table covers its
proposals too (Work.draft), shrunk back when fewer are proposed (speculator.py: when, what,
and its decode's blocks: Speculator.plan_decode)."""

from __future__ import annotations

from troupe.actors.core.held_token import holds_last_token
from troupe.actors.core.kv_release import commit_ops, window_releases
from troupe.actors.core.request_queues import RequestQueues
from troupe.actors.core.request_state import Request, Status
from troupe.actors.core.sample_fork import SampleForks
from troupe.actors.core.speculator import Speculator
from troupe.actors.core.step_limits import StepLimits
from troupe.actors.core.step_starts import start_queued
from troupe.actors.core.step_work import Kind, Work
from troupe.messages.allocator import OP_ORDER, AllocOp, CacheBlocks, FreeRequest, Grow, SwapOut
from troupe.messages.images import whole_image_end
from troupe.policies.preemption import PreemptionPolicy

Tokens = tuple[int, ...]


class StepPlanner:
    """Plans steps over `queues`; who gives way, and how, is the `preemption` policy's choice."""

    def __init__(
        self,
        limits: StepLimits,
        queues: RequestQueues,
        preemption: PreemptionPolicy,
        speculator: Speculator,
        *,
        hold_last: bool = False,  # prompts joining decodes hold their last token (held_token.py)
    ) -> None:
        self.limits, self.queues, self.preemption = limits, queues, preemption
        self.speculator, self.hold_last = speculator, hold_last
        self.forks = SampleForks()  # parallel sampling's parents and samples
        self.to_commit: dict[str, Request] = {}  # computed new full blocks to cache
        self.num_preemptions_swap = self.num_preemptions_recompute = 0
        self.unfittable: list[Request] = []  # ended: more blocks than the pool has
        self.has_streaming = False  # a StreamingLLM request was ever added: check releases
        # This step's plan as it is made: its entries and ops (in plan order; a victim's are
        # undone), the blocks left, and victims' planned tokens back to the budget.
        self.work: dict[str, Work] = {}
        self._ops: dict[type, list[AllocOp]] = {}
        self.avail = self._cpu_avail = self._returned = 0
        self._preempted = self.decoding = False  # any victim; any decode (held_token.py)

    def plan(self, num_gpu_free: int, num_cpu_free: int) -> list[AllocOp] | None:
        """This step's allocator ops, in the order they must apply (None: nothing to do)."""
        lim, q = self.limits, self.queues
        bs, lookahead = lim.block_size, lim.num_lookahead_tokens
        ops = self._ops = {kind: [] for kind in OP_ORDER}
        work = self.work = {}
        self._preempted, self.avail, self._cpu_avail = False, num_gpu_free, num_cpu_free
        ops[CacheBlocks] += commit_ops(self.to_commit.values(), bs)
        self.to_commit = {}
        for req in q.to_free.values():
            if req.in_allocator:
                self._free(req)
        q.to_free = {}
        if lim.kv_window or self.has_streaming:
            for op, num_freed in window_releases(lim, q.running):
                self.add_op(op)
                self.avail += num_freed
        budget, forks = lim.max_num_batched_tokens, self.forks
        if forks.parents or forks.samples:
            budget = forks.plan(self, budget)
        prefills: list[Request] = []
        running, speculating = Status.RUNNING, self.speculator.enabled  # locals: a hot loop
        run, grows = Kind.RUN, ops[Grow]
        proposing = self.speculator.step_allows(len(q.running))
        # A snapshot: preemption removes victims from q.running while this loop runs.
        for req in list(q.running):
            if budget == 0:
                break
            if req.status is not running:
                continue  # preempted earlier in this loop
            computed = req.num_computed
            if len(req.token_ids) - computed != 1:
                prefills.append(req)
            elif speculating and (proposing or (req.num_blocks - 1) * bs > computed + lookahead):
                # proposing, or holding a block only earlier proposals needed (to shrink)
                budget = self.speculator.plan_decode(self, req, budget, proposing)
            elif computed + lookahead < req.num_blocks * bs:  # the common decode: no new block
                work[req.request_id] = req.decode  # made once per request: no allocation
                budget -= 1
            elif (need := -(-(computed + 1 + lookahead) // bs) - req.num_blocks) > self.avail:
                budget = self.fit(req, 1, need, budget)  # victims give way, or `req` does
            else:  # a decode at a block boundary, its blocks there: `fit`'s common case
                self.avail -= need
                work[req.request_id] = Work(req, 1, run, need)
                grows.append(Grow(req.request_id, computed + 1 + lookahead))
                budget -= 1
        self.decoding = self.hold_last and bool(work)
        for req in prefills:
            if budget == 0:
                break
            if req.status is not running:
                continue  # preempted earlier in this loop
            computed = req.num_computed
            end = computed + lim.chunk(req.compute_end - computed, budget)
            whole = bool(req.images and lim.image_rows)  # no chunk ends inside an image
            if whole and (end := whole_image_end(req.images, computed, end)) == computed:
                continue  # the image waits for a step with budget for all of it
            need = max(lim.blocks_for(end + lim.lookahead(end, req.num_tokens)) - req.num_blocks, 0)
            if need > self.avail and (fit := (req.num_blocks + self.avail) * bs) > computed:
                # A chunk shrinks to the blocks there are before preempting (a last chunk that
                # fits only without its lookahead keeps its length and goes without); one
                # that would end inside an image is cut back to it, or, with nothing left,
                # keeps its length: `fit` finds the image's blocks by preempting
                shrunk = min(end, fit)
                if whole:
                    shrunk = whole_image_end(req.images, computed, shrunk)
                if shrunk > computed:
                    end, need = shrunk, max(lim.blocks_for(shrunk) - req.num_blocks, 0)
            held = self.decoding and holds_last_token(req, end)
            budget = self.fit(req, end - computed, need, budget, held)
        forks.rejoin(q)
        if self._preempted:  # the Grows of victims planned earlier in this step go too
            ops[Grow] = [op for op in ops[Grow] if op.request_id in work]
        else:
            start_queued(self, budget)
        flat = [op for kind_ops in ops.values() for op in kind_ops]
        return flat if flat or work else None

    def add(self, req: Request) -> None:
        self.queues.add(req)
        self.has_streaming |= bool(req.stream_window)

    def add_op(self, op: AllocOp) -> None:
        self._ops[type(op)].append(op)

    def fit(
        self, req: Request, n: int, need: int, budget: int, held: bool = False, draft: Tokens = ()
    ) -> int:
        """Plan `n` tokens of a running request needing `need` more blocks (`held`: the last
        of them waits for the next step; `draft`: proposals after them); the budget left."""
        if need > self.avail:  # victims give way (their planned tokens back), or `req` does
            total = self.limits.blocks_for(req.num_computed + n) - req.num_released
            got = self.room(req, need, total)
            budget, self._returned = budget + self._returned, 0
            if got is None:
                return budget
        else:  # the common case (a decode at a block boundary): nothing to look for
            got = need
            self.avail -= need
        rid, n = req.request_id, n + len(draft)
        self.work[rid] = Work(req, n - held, Kind.RUN, need=got, draft=draft, held=held)
        if got > 0:  # the Grow covers the chunk and its lookahead, as far as `got` reaches
            lim, end = self.limits, req.num_computed + n
            end += lim.lookahead(end, req.num_tokens)
            self._ops[Grow].append(Grow(rid, min(end, (req.num_blocks + got) * lim.block_size)))
        return budget - n

    def room(self, req: Request, need: int, total: int) -> int | None:
        """Count `need` more blocks for running `req` (a grow, a chunk, a fork), preempting the
        policy's victims until they fit; the count taken, or None if `req` gave way (preempted,
        or failed: `total`, the blocks it would hold, exceeds the pool)."""
        num_gpu_blocks = self.limits.num_gpu_blocks
        while need > self.avail:
            self._preempted = True
            running = self.queues.running
            if (victim := self.preemption.victim(running)) is req:
                if len(running) > 1 or self.queues.awaiting or self.forks.num_set_aside:
                    self._preempt(req)
                    return None
                # Alone: once this batch's releases apply, every other block is free, whatever
                # the (lower-bound) count says; it fits if its tokens fit in the whole pool.
                if total > num_gpu_blocks:
                    self.fail(req)
                    return None
                need = self.avail = min(need, num_gpu_blocks - req.num_blocks + req.num_released)
                break
            undone = self.work.pop(victim.request_id, None)
            if undone is not None:  # planned earlier this step: its share back (fit's budget)
                self._returned += undone.num_tokens
                self.avail += undone.need
            self._preempt(victim)
        self.avail -= need
        return need

    def _free(self, req: Request) -> None:
        """Release all the request's blocks in this batch, counting what that frees."""
        self.add_op(FreeRequest(req.request_id))
        self.avail += req.num_blocks - req.num_released - req.num_shared
        self._cpu_avail += req.num_cpu_blocks
        req.num_blocks = req.num_shared = req.num_cpu_blocks = req.num_released = 0
        req.in_allocator = False

    def _preempt(self, req: Request) -> None:
        """Take a running request off the GPU: swap it out, or free it for recompute."""
        req.needs_reset = True
        if not self.preemption.swaps(req, self._cpu_avail):
            self._free(req)
            self.queues.recompute(req)
            self.num_preemptions_recompute += 1
            return
        self.add_op(SwapOut(req.request_id))
        held = req.num_blocks - req.num_released  # released positions stay in its table
        self.avail += held - req.num_shared
        self._cpu_avail -= held
        req.num_cpu_blocks, req.num_blocks, req.num_shared = held, req.num_released, 0
        self.queues.move(req, Status.SWAPPED)
        self.num_preemptions_swap += 1

    def fail(self, req: Request) -> None:
        """End a request that needs more blocks than the pool has; free them in this batch."""
        self.queues.finish(req)
        if self.queues.to_free.pop(req.request_id, None) is not None:
            self._free(req)
        self.unfittable.append(req)
