"""Queued requests that start a step, once the running ones are planned: swapped requests resume
first, then waiting ones start (only while none is swapped), each in queue order while the
blocks, the token budget and the seats last. The planner skips this pass in a step that
preempted, so a victim is not overtaken by later arrivals.

Seats: max_num_seqs, less the running requests, those awaiting a late token, and the seats a
parallel-sampling parent holds for its samples (sample_fork.py). A waiting request is counted at
the most blocks it may take: all it computes this step, less only those of the longest cached
prefix it could hit. With prefix caching, a waiting request whose first block is that of a
prompt still being prefilled (in the same cache namespace: a LoRA adapter's or a cache_salt's
KV serves only its own) waits until that prefill is done and cached, so a shared prefix is
computed once, not once per request. With LoRA adapters, a request of an adapter that would
make more than max_loras run waits (lora_slots.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from troupe.actors.core.held_token import holds_last_token
from troupe.actors.core.kv_release import cache_limit, peak_blocks
from troupe.actors.core.lora_slots import AdapterSlots
from troupe.actors.core.request_state import Request, Status
from troupe.actors.core.step_work import Kind, Work
from troupe.messages.allocator import AllocateNew, SwapIn
from troupe.messages.images import whole_image_end

if TYPE_CHECKING:
    from troupe.actors.core.step_planner import StepPlanner


def start_queued(planner: StepPlanner, budget: int) -> None:
    """Start the swapped, then the waiting requests that fit what the step has left."""
    lim, q = planner.limits, planner.queues
    seats = lim.max_num_seqs - len(q.running) - len(q.awaiting)
    seats -= planner.forks.extra_seats() if planner.forks.parents else 0
    adapters = AdapterSlots(q, lim.max_loras) if lim.max_loras else None  # None: no LoRA
    while q.swapped and budget > 0 and q.swapped[0].num_samples <= seats:
        req = q.swapped[0]
        if adapters is not None and not adapters.admits(req):
            break  # its adapter waits for a running one's requests to end, as blocks would
        n = lim.chunk(req.compute_end - req.num_computed, budget)
        if req.images and lim.image_rows:  # no chunk ends inside an image (step_limits.py)
            n = whole_image_end(req.images, req.num_computed, req.num_computed + n)
            n -= req.num_computed
            if n == 0:
                break
        cover = req.num_computed + n + lim.lookahead(req.num_computed + n, req.num_tokens)
        total = max(req.num_cpu_blocks, lim.blocks_for(cover) - req.num_released)
        if total > planner.avail:
            break
        work = Work(req, n, Kind.SWAP_IN, need=total)
        seats -= _start(planner, work, SwapIn(req.request_id, cover), adapters)
        budget -= n
    if not q.swapped:
        _admit_waiting(planner, budget, seats, adapters)


def _admit_waiting(
    planner: StepPlanner, budget: int, seats: int, adapters: AdapterSlots | None
) -> None:
    lim, q = planner.limits, planner.queues
    bs, caching = lim.block_size, lim.enable_prefix_caching
    # (namespace, first block) of prompts being prefilled: requests that start the same way in
    # the same namespace wait for them
    leaders = {
        (r.cache_namespace, r.cache_tokens(0, bs))
        for r in (q.running if caching and q.waiting else ())
        if r.num_computed < r.prompt_len and r.prompt_len > bs
    }
    deferred: list[Request] = []
    while q.waiting and budget > 0 and q.waiting[0].num_samples <= seats:
        req = q.waiting[0]
        num_tokens = req.num_tokens
        if peak_blocks(lim, req) > lim.num_gpu_blocks:
            planner.fail(req)  # grew past the pool while preempted
            continue
        if adapters is not None and not adapters.admits(req):
            deferred.append(q.take(req))  # another adapter's turn; later ones may start
            continue
        namespace = req.cache_namespace
        head = (namespace, req.cache_tokens(0, bs)) if caching and num_tokens > bs else None
        if head in leaders:
            deferred.append(q.take(req))
            continue
        n = lim.chunk(req.compute_end, budget)
        if req.images and n < min(lim.image_rows, req.compute_end):
            break  # room for a whole image after any prefix hit (step_limits.py)
        limit = cache_limit(req)  # streaming: hits only where its KV is the same
        max_hit = (min(num_tokens, limit or num_tokens) - 1) // bs * bs if caching else 0
        upper = lim.blocks_for(min(num_tokens, max_hit + n))
        if upper > planner.avail:
            break
        if head is not None:
            leaders.add(head)
        req.in_allocator = True
        op = AllocateNew(req.request_id, req.cache_tokens(0, num_tokens), n, limit, namespace)
        held = planner.decoding and holds_last_token(req, n)  # its blocks cover it
        seats -= _start(planner, Work(req, n, Kind.NEW, need=upper, held=held), op, adapters)
        budget -= n
    for req in deferred:  # back in their places: the queue is sorted by a fixed key
        q.enqueue(req, Status.WAITING)


def _start(
    planner: StepPlanner, work: Work, op: SwapIn | AllocateNew, adapters: AdapterSlots | None
) -> int:
    """Start a swapped or waiting request with the blocks `work` counts; the seats it takes
    (a parallel-sampling parent's: one per sample)."""
    planner.add_op(op)
    planner.avail -= work.need
    planner.queues.move(work.req, Status.RUNNING)
    planner.work[work.req.request_id] = work
    if adapters is not None:
        adapters.started(work.req)
    return work.req.num_samples
