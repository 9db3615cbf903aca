"""Parallel sampling in the scheduler: a request of k > 1 samples (SamplingParams.n / best_of)
is prefilled once, then forked into k sequences that share its KV blocks.

    parent  prompt t0 .. t8 (block_size 4)       computes t0..t7 only, never samples
    table   [b0 b1]  (b1 full, t8 not computed)
    Fork    sample 0: [b0 b1 | grown]   sample 1: [b0 b1 | grown]   ...  (b0, b1: k references)

The parent stops one token short of its prompt. Once t0..t(P-2) are computed the planner's
fork pass (`SampleForks.plan`, before it plans anything else) sends one `Fork` op: the
allocator gives every sample the parent's table, one reference more per full block, and copies
the last, partial block for every sample but the first (copy on write: `copy_blocks`, which
the executor copies on the device before the step). Each sample is then a request of its own
(preemptible, abortable, streamed under its index): in the same step it computes the last
prompt token and samples its first token with its own seed, exactly as the request run alone
would. The parent's id lives on only as the family's name: an abort of it ends every sample
(one SeqOutput under the parent's id, which the streamer fans out to the samples still open).

Seats: a parent counts as k running requests from its admission (`extra_seats`), so the fork
never exceeds max_num_seqs. A parent whose k tokens do not fit the step's budget waits a step
out of the running queue (not planned, not a victim), then forks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from troupe.actors.core.request_queues import RequestQueues
from troupe.actors.core.request_state import Request, Status
from troupe.actors.core.step_work import Kind, Work
from troupe.messages.allocator import Fork
from troupe.messages.samples import sample_id, sample_params

if TYPE_CHECKING:
    from troupe.actors.core.step_planner import StepPlanner


class SampleForks:
    """The scheduler's families: parents not yet forked, and each forked parent's samples."""

    def __init__(self) -> None:
        self.parents: dict[str, Request] = {}  # live, not forked yet
        self.samples: dict[str, list[Request]] = {}  # forked parent id -> its samples
        self._rejoin: list[Request] = []  # out of the running queue while the loops plan

    @property
    def num_set_aside(self) -> int:
        """Forked samples and deferred parents out of the running queue until `rejoin`: they
        hold blocks all the same."""
        return len(self._rejoin)

    def add(self, req: Request) -> list[Request]:
        """The requests to queue for an admitted one: itself, or for a one-token prompt (nothing
        to share), its samples at once."""
        if req.num_samples == 1:
            return [req]
        if req.prompt_len > 1:
            self.parents[req.request_id] = req
            return [req]
        samples = [self._sample(req, i) for i in range(req.num_samples)]
        self.samples[req.request_id] = samples
        return samples

    def extra_seats(self) -> int:
        """Seats running parents hold beyond their own: each will become k requests."""
        running = Status.RUNNING
        return sum(p.num_samples - 1 for p in self.parents.values() if p.status == running)

    def abort(self, request_id: str, queues: RequestQueues) -> bool:
        """End a forked request's samples still live (silently: the caller sends the one
        SeqOutput under the parent's id); False if none was live."""
        samples = self.samples.pop(request_id, None)
        self.parents.pop(request_id, None)
        live = [s for s in samples or () if s.status != Status.FINISHED]
        for sample in live:
            queues.finish(sample)
        return bool(live)

    def plan(self, planner: StepPlanner, budget: int) -> int:
        """Fork every running parent whose prompt is computed but its last token, if its blocks
        fit (preempting the policy's victims as a grow would) and its k tokens fit `budget`.
        Forked samples and deferred parents rejoin the running queue after the planner's loops
        (`rejoin`); returns the budget left."""
        self._sweep()
        lim, q = planner.limits, planner.queues
        for parent in [p for p in self.parents.values() if p.status == Status.RUNNING]:
            if parent.status != Status.RUNNING or parent.num_computed < parent.num_tokens - 1:
                continue  # preempted for an earlier one, or still prefilling
            k, computed = parent.num_samples, parent.num_computed
            cover = computed + 1 + lim.num_lookahead_tokens
            partial = computed % lim.block_size != 0
            table = parent.num_blocks  # child 0 keeps it; the others copy the partial block
            others = lim.blocks_for(computed) - partial  # the full blocks they share
            need = max(0, lim.blocks_for(cover) - table)
            need += (k - 1) * (partial + max(0, lim.blocks_for(cover) - others - partial))
            if k > budget:
                q.take(parent)  # waits a step, neither planned nor a victim
                self._rejoin.append(parent)
                continue
            held = parent.num_blocks - parent.num_released
            if planner.room(parent, need, need + held) is None:
                continue  # preempted or failed
            budget -= k
            self._fork(planner, parent, cover)
        return budget

    def rejoin(self, queues: RequestQueues) -> None:
        for req in self._rejoin:
            queues.enqueue(req, Status.RUNNING)
        self._rejoin = []

    def _fork(self, planner: StepPlanner, parent: Request, cover: int) -> None:
        q, rid = planner.queues, parent.request_id
        q.take(parent)
        parent.status = Status.FINISHED
        del q.requests[rid]
        del self.parents[rid]
        if parent.in_executor:
            q.released.append(rid)
        parent.in_allocator = False  # its blocks are the samples' now
        samples = [self._sample(parent, i) for i in range(parent.num_samples)]
        self.samples[rid] = samples
        child_ids = tuple(s.request_id for s in samples)
        planner.add_op(Fork(rid, child_ids, parent.num_computed, cover))
        for sample in samples:
            sample.status, sample.in_allocator = Status.RUNNING, True
            sample.num_computed = parent.num_computed
            sample.num_committed_blocks = parent.num_committed_blocks
            sample.num_released, sample.num_cached_tokens = (
                parent.num_released,
                parent.num_cached_tokens,
            )
            # counted as all shared until the allocator says: a plan never over-counts frees
            sample.num_blocks = parent.num_blocks
            sample.num_shared = parent.num_blocks - parent.num_released
            q.requests[sample.request_id] = sample
            planner.work[sample.request_id] = Work(sample, 1, Kind.FORK)
            self._rejoin.append(sample)

    @staticmethod
    def _sample(parent: Request, index: int) -> Request:
        return Request(
            request_id=sample_id(parent.request_id, index),
            params=sample_params(parent.params, index),
            token_ids=list(parent.token_ids),
            prompt_len=parent.prompt_len,
            max_total_tokens=parent.max_total_tokens,
            arrival_seq=parent.arrival_seq,
            stop_ids=parent.stop_ids,
            sort_key=parent.sort_key,
            embeds=parent.embeds,
            images=parent.images,  # a recomputed sample encodes them again
        )

    def _sweep(self) -> None:
        """Forget families whose samples have all ended."""
        ended = Status.FINISHED
        done = [p for p, s in self.samples.items() if all(r.status == ended for r in s)]
        for parent_id in done:
            del self.samples[parent_id]
        for parent_id in [p for p, r in self.parents.items() if r.status == ended]:
            del self.parents[parent_id]
