"""From the allocator's answer to the executor's StepPlan. Granted block ids pass through here
into each SeqWork; the scheduler keeps only their number. A refused op takes its request out of
this step: a Grow waits for the next plan, a SwapIn or AllocateNew goes back to its queue, and a
SwapOut was freed by the allocator instead, so its request is recomputed."""

from __future__ import annotations

from troupe.actors.core.request_state import Request, Status
from troupe.actors.core.step_planner import StepPlanner
from troupe.actors.core.step_work import Kind
from troupe.messages.executor import SeqWork, StepPlan
from troupe.messages.images import images_in, whole_image_end
from troupe.messages.scheduler import AllocationResult, RefusalReason

InFlight = tuple[Request, int, bool]  # (request, its end position after the step, samples)


def build_plan(
    planner: StepPlanner, result: AllocationResult
) -> tuple[StepPlan | None, list[InFlight]]:
    """Apply `result` to the planner's entries; the StepPlan (None: idle) and what it computes."""
    q, work = planner.queues, planner.work
    for refusal in result.refused:
        rid = refusal.request_id
        if refusal.reason == RefusalReason.NO_CPU_BLOCKS:  # a SwapOut: freed instead
            req = q.find(rid)
            assert req is not None, f"refused SwapOut of unknown request {rid!r}"
            req.in_allocator = False
            if req.status == Status.SWAPPED:
                q.recompute(req)
                planner.num_preemptions_swap -= 1
                planner.num_preemptions_recompute += 1
            continue
        w = work.pop(rid)
        if w.kind is Kind.NEW:
            w.req.in_allocator = False
        if w.kind is not Kind.RUN and w.req.status == Status.RUNNING:
            q.move(w.req, Status.WAITING if w.kind is Kind.NEW else Status.SWAPPED)
    blocks: dict[str, tuple[int, ...]] = {}
    for grant in result.grants:
        w, blocks[grant.request_id] = work[grant.request_id], grant.block_ids
        req, num_granted = w.req, len(grant.block_ids)
        if w.kind is Kind.RUN:
            req.num_blocks += num_granted
            continue
        req.num_blocks, req.num_shared, req.num_cpu_blocks = num_granted, 0, 0
        if w.kind is Kind.NEW:
            req.num_computed = grant.num_cached_tokens
            req.num_committed_blocks = grant.num_cached_tokens // planner.limits.block_size
            if req.num_tokens == req.prompt_len:  # first start, not a recompute
                req.num_cached_tokens = grant.num_cached_tokens
    for rid, num_shared in result.shared:
        if (found := q.find(rid)) is not None:
            found.num_shared = num_shared
    seqs: list[SeqWork] = []
    in_flight: list[InFlight] = []
    verifications: list[SeqWork] = []
    verified: list[InFlight] = []
    running, add_seq, add_in_flight = Status.RUNNING, seqs.append, in_flight.append
    reads_hidden = False
    whole_images = planner.limits.image_rows > 0
    for w in work.values():
        req = w.req
        if req.status is not running:
            continue  # ended while the allocator worked
        start = req.num_computed
        if w is req.decode and not req.needs_reset and start >= req.prompt_len:
            # The hot path: a decode with no new block; building its SeqWork dominates it. A
            # prompt's last token computed alone (its chunk was cut one short) looks like a
            # decode but takes the long way: it may be pooled (SeqWork.pools).
            add_seq(SeqWork(req.request_id, (req.token_ids[start],), start))
            add_in_flight((req, start + 1, True))
            continue
        tokens, num_tokens = req.token_ids, len(req.token_ids)
        assert not req.needs_reset or w.kind is not Kind.RUN, f"{req} has no whole table"
        held = w.held and start < req.compute_end - 1  # its last token: the next step's
        end = start + w.num_tokens
        if end > (last := req.compute_end - held):  # min() costs a call here
            end = last
        if req.images and whole_images:  # an image's rows attend to each other: one chunk
            end = whole_image_end(req.images, start, end)
            assert end > start, f"{req}: the planner left no room for a whole image"
        if end <= start:
            continue  # a parallel-sampling parent with all it computes cached: it forks next
        first = not req.in_executor
        prompt_len, scores = req.prompt_len, req.params.prompt_logprobs is not None
        pools = req.params.pooling is not None and start < prompt_len
        # penalties and bad words read earlier tokens: those a prefix hit (or a parent) computed
        history = tuple(tokens[:start]) if first and start and req.params.needs_history else ()
        # Verifications go last, so the one-token decodes lead the step (the runner's decode
        # kernel takes that prefix: gpu/step_inputs.py num_decode_prefix).
        num_scored = max(0, min(end, prompt_len - 1) - start) if scores else 0
        reads_hidden |= num_scored > 0 or pools
        embeds = req.embeds  # an embeddings prompt: the chunk's rows, cut from the kept whole
        rows = embeds.rows(start, min(end, prompt_len)) if embeds and start < prompt_len else None
        images = images_in(req.images, start, end) if req.images and start < prompt_len else ()
        (verifications if w.draft else seqs).append(
            SeqWork(
                request_id=req.request_id,
                token_ids=tuple(tokens[start:end]),
                start_pos=start,
                block_ids=blocks.get(req.request_id, ()),
                reset=req.needs_reset,
                sample=end == num_tokens,
                params=req.params if first else None,
                num_prompt_tokens=req.prompt_len if first else 0,
                draft_token_ids=w.draft,
                num_dropped_blocks=w.num_dropped,
                history=history,
                next_token=tokens[end] if held else -1,
                num_scored=num_scored,
                after_chunk=tokens[end] if num_scored and end < prompt_len else -1,
                pools=pools,
                prompt_embeds=rows,
                images=images,
            )
        )
        req.in_executor, req.needs_reset, req.draft = True, False, w.draft
        (verified if w.draft else in_flight).append((req, end, end == num_tokens))
    seqs += verifications
    in_flight += verified
    planner.work = {}
    if not seqs and not result.swap_out and not result.swap_in and not result.copy_blocks:
        return None, in_flight
    released, q.released = tuple(q.released), []
    return StepPlan(
        step_id=result.step_id,
        seqs=tuple(seqs),
        swap_out=result.swap_out,
        swap_in=result.swap_in,
        released=released,
        copy_blocks=result.copy_blocks,
        reads_hidden=reads_hidden,
    ), in_flight
