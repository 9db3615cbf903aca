"""What an EAGLE head has read of each request: which positions of its KV pool hold rows fed
with the target's hidden states, and the one row that waits for its next token.

A head row at position p needs the token at p + 1 and the target's final hidden state at p
(gpu/eagle_model.py); the hidden state exists only in the step that computed p. So every
step feeds the head the rows of that step whose next token is known, and keeps the hidden
state of a row whose next token is not (the last row of a prefill chunk that does not
sample: its next token opens the next chunk):

    target step      positions s .. s+n-1 (chunk)     then the sampled t (and accepted ones)
    head rows        [pending at s-1] s .. s+n-2 | s+n-1 with t ...  (row p: token p+1, h_p)
    after the round  computed = committed - 1: the last committed token's row waits for
                     its hidden state, which the next step computes

A verification step computes t, d1..dk; the accepted d1..da and the target's token b commit,
and the head is fed rows t .. da with the target's own hidden states of those rows (the
rows it wrote while proposing, fed its own hidden states, are written over, as vLLM does).

Best effort, as the draft model's cache (gpu/draft_state.py): rows the head never got (a
prefix-cache hit, a gap) are taken as present; a stale row lowers acceptance, never changes
an output (the target verifies every proposal).
"""

from __future__ import annotations

import dataclasses

import torch
from troupe.gpu.draft_state import Offers
from troupe.messages import SampledToken, SeqWork


@dataclasses.dataclass(eq=False)
class EagleSeq(Offers):
    computed: int = 0  # positions [0, computed) hold the head's rows
    pending: torch.Tensor | None = None  # the target's hidden state at `computed`: [hidden]


@dataclasses.dataclass(frozen=True)
class HeadFeed:
    """One sequence's rows of a round: positions start .. start + len(token_ids) - 1."""

    request_id: str
    seq: EagleSeq
    start: int
    token_ids: tuple[int, ...]  # each row's next token
    pending: torch.Tensor | None  # the first row's hidden state (else all from the step)
    first_row: int  # the step's row of the first (next) row's hidden state
    num_committed: int  # the request's committed tokens after the step


class EagleSeqs:
    """Every live request's EagleSeq, updated from each StepPlan and its sampled tokens."""

    def __init__(self, backoff_steps: int = 16) -> None:
        self.backoff_steps = backoff_steps
        self.by_id: dict[str, EagleSeq] = {}

    def release(self, request_ids: tuple[str, ...]) -> None:
        for request_id in request_ids:
            self.by_id.pop(request_id, None)

    def clear(self) -> None:
        self.by_id.clear()

    def feed(
        self, work: SeqWork, token: SampledToken | None, first_row: int, hidden: torch.Tensor
    ) -> HeadFeed:
        """The head's rows after `work` (its rows start at `first_row` of the step's final
        hidden states `hidden`); `token`: what it sampled, None if nothing."""
        start = work.start_pos
        seq = self.by_id.get(work.request_id)
        if seq is None:  # positions before start_pos: the prefix cache's, taken as present
            seq = self.by_id[work.request_id] = EagleSeq(computed=start)
        if seq.computed != start - 1 or seq.pending is None:
            # no row waits for this chunk's first token: the rows from start on are fed now
            # (a recompute from start_pos, or a gap taken as present)
            seq.computed, seq.pending = start, None
        seq.follow(work, self.backoff_steps)
        stream = work.token_ids
        num_hidden = len(work.token_ids)  # the step's rows of committed tokens
        if token is not None:
            stream += (token.token_id, *token.more)
            num_hidden += len(token.more)  # accepted proposals
        pending, seq.pending = seq.pending, None
        first = start
        ids = stream[1 : 1 + num_hidden]
        if pending is not None:  # the last chunk's row: its next token opens this chunk
            first, ids = start - 1, stream[:1] + ids
        if num_hidden == len(stream):  # no next token for the last row yet: keep its state
            seq.pending = hidden[first_row + num_hidden - 1].clone()
        seq.computed = first + len(ids)
        num_committed = start + len(stream)
        return HeadFeed(work.request_id, seq, first, ids, pending, first_row, num_committed)
