"""PhaseRouter core: prefill/decode disaggregation between the scheduler and two executors.

The scheduler plans one step for one executor; the router splits each StepPlan in two and
joins the two answers into the StepResult the scheduler expects (and LateTokens). It owns two facts: which
executor a request's work runs on, and which executor holds the latest contents of each KV
block (kv_residency.py).

    a request's chunks ─► prefill executor; its sampled chunk moves it to decode
    its decodes ──────────► decode executor (the first one brings its table and params: reset)
    a recompute (reset) ──► prefill again, then back
    blocks a side reads but the other holds ─► send_blocks / recv_blocks of both shares

Both executors' pools share the allocator's block ids, so the allocator and the scheduler's
block accounting are unchanged. A side with nothing to do this step gets no plan. A step
with decodes is answered when the decode side is (step_join.py): the prefill side works
through prompt chunks at its own pace, and a prompt's first token sampled there after its
step's result went out comes to the scheduler later (StepResult.late, then LateTokens). A
step with nothing awaited is answered at once.

Requests without a seed get one here, drawn from the engine's `seed` in the order a single
executor would draw it (request_seeds.py): both sides then sample the same stream.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from troupe.actors.core.base import Outgoing
from troupe.actors.core.kv_residency import KVResidency
from troupe.actors.core.phase_requests import PhaseRequest
from troupe.actors.core.step_join import StepJoins
from troupe.messages.executor import SeqWork, StepPlan
from troupe.messages.phase_router import Phase, PhaseRouterInbox
from troupe.request_seeds import SeedSource

OUTBOX = {Phase.PREFILL: "prefill_executor", Phase.DECODE: "executor"}
OTHER = {Phase.PREFILL: Phase.DECODE, Phase.DECODE: Phase.PREFILL}


class PhaseRouterCore:
    """Inbox: StepPlan (scheduler), PhaseStepResult (executors). Outboxes: "prefill_executor",
    "executor" (the decode side), "scheduler" (StepResult, LateTokens)."""

    def __init__(self, *, block_size: int, seed: int) -> None:
        self.block_size = block_size
        self.residency = KVResidency()
        self.requests: dict[str, PhaseRequest] = {}
        self.joins = StepJoins()
        self._seeds = SeedSource(seed)
        self.num_blocks_sent = {Phase.PREFILL: 0, Phase.DECODE: 0}  # by the sending side

    def handle(self, batch: Sequence[PhaseRouterInbox]) -> Outgoing:
        out: Outgoing = []
        for msg in batch:
            if isinstance(msg, StepPlan):
                out += self.split(msg)
                continue
            out += [("scheduler", m) for m in self.joins.answer(msg.phase, msg.result)]
        return out

    def split(self, plan: StepPlan) -> Outgoing:
        """The two executors' shares of `plan` (only the sides with work get one)."""
        if plan.swap_out or plan.swap_in or plan.copy_blocks:
            raise ValueError(
                "disaggregation: a plan with swaps or block copies (swap preemption, the "
                "prefix cache's CPU tier and parallel sampling are refused at start-up)"
            )
        released: dict[Phase, list[str]] = {Phase.PREFILL: [], Phase.DECODE: []}
        for request_id in plan.released:
            gone = self.requests.pop(request_id, None)
            if gone is not None and gone.holder is not None:
                released[gone.holder].append(request_id)
        seqs: dict[Phase, list[SeqWork]] = {Phase.PREFILL: [], Phase.DECODE: []}
        prefill_sampled: list[str] = []  # its first token: maybe late (step_join.py)
        reads: list[tuple[Phase, list[int]]] = []
        writes: list[tuple[Phase, list[int]]] = []
        bs = self.block_size
        for work in plan.seqs:
            req = self._request(work)
            req.apply(work)
            if work.reset:
                req.phase = Phase.PREFILL  # recomputed: a prefill again
            side = req.phase
            if req.holder is None or req.holder != side:
                if req.holder is not None:
                    released[req.holder].append(work.request_id)
                share = req.moved_work(work)
            elif work.params is not None:
                share = msgspec.structs.replace(work, params=req.params)
            else:
                share = work
            req.holder = side
            seqs[side].append(share)
            end = work.start_pos + len(work.token_ids)
            reads.append((side, req.table[: -(-work.start_pos // bs)]))
            writes.append((side, req.table[work.start_pos // bs : -(-end // bs)]))
            if side == Phase.PREFILL and work.sample:
                req.phase = Phase.DECODE  # its first token comes from this chunk
                prefill_sampled.append(work.request_id)
        incoming = self._transfers(reads, writes)
        order = tuple(w.request_id for w in plan.seqs if w.sample)
        shares: dict[Phase, StepPlan] = {}
        for side in Phase:
            sends, receives = incoming[OTHER[side]], incoming[side]
            if seqs[side] or released[side] or sends or receives:
                shares[side] = StepPlan(
                    step_id=plan.step_id,
                    seqs=tuple(seqs[side]),
                    released=tuple(released[side]),
                    send_blocks=tuple(sends),
                    recv_blocks=tuple(receives),
                )
            self.num_blocks_sent[side] += len(sends)
        # the prefill share is awaited only if it samples and no decode share answers
        out: Outgoing = [(OUTBOX[side], share) for side, share in shares.items()]
        started = self.joins.start(plan.step_id, order, set(shares), tuple(prefill_sampled))
        return out + [("scheduler", m) for m in started]

    def _request(self, work: SeqWork) -> PhaseRequest:
        req = self.requests.get(work.request_id)
        if req is not None:
            return req
        if work.params is None:
            raise ValueError(f"request {work.request_id!r}: first SeqWork carries no params")
        params = work.params
        if params.seed is None:
            params = msgspec.structs.replace(params, seed=self._seeds.draw())
        req = PhaseRequest(params, work.num_prompt_tokens)
        self.requests[work.request_id] = req
        return req

    def _transfers(
        self, reads: list[tuple[Phase, list[int]]], writes: list[tuple[Phase, list[int]]]
    ) -> dict[Phase, list[int]]:
        """Blocks each side receives before this step (what it reads and does not hold), then
        the step's writes: the writer alone holds those blocks' latest contents."""
        incoming: dict[Phase, list[int]] = {Phase.PREFILL: [], Phase.DECODE: []}
        queued: dict[Phase, set[int]] = {Phase.PREFILL: set(), Phase.DECODE: set()}
        for side, blocks in reads:
            for block_id in self.residency.missing(side, blocks):
                if block_id not in queued[side]:
                    queued[side].add(block_id)
                    incoming[side].append(block_id)
        for side, blocks in incoming.items():
            self.residency.copied(side, blocks)
        for side, blocks in writes:
            self.residency.written(side, blocks)
        return incoming
