"""What the draft model has seen of each request: which positions of its own KV pool hold
the KV of committed tokens, and which committed tokens it has yet to read (its catch-up).

The draft's pool is indexed by the target's block tables (the same block ids, a second and
smaller pool: gpu/draft_runner.py), so this keeps no block ids, only positions and tokens:

    positions   0 .......... computed-1 | computed ... (known) ... | spec KV: e1 e2 ...
                draft KV of committed       committed tokens not      tokens the draft fed while
                tokens (valid)              yet fed to the draft      proposing, at the positions
                                                                      after the last known token

After a verification the committed tokens after `computed` are matched against `spec`: the
accepted proposals' KV is already in the pool, so only the rest (the bonus token, and the
last proposal when all were accepted) is caught up. A position past `computed` is never read
before it is written again, so rejected proposals' KV is simply overwritten later.

The draft's cache is best-effort by design: the target verifies every proposal, so a stale
slot can lower acceptance but never change an output. Positions a request starts with from
the prefix cache (a SeqWork with reset and start_pos > 0) are taken as present: the request
that computed those blocks fed them to the draft as well, unless its draft lagged.
"""

from __future__ import annotations

import dataclasses

from troupe.messages import SampledToken, SeqWork


@dataclasses.dataclass(eq=False)
class Offers:
    """Whether the scheduler used the proposals offered for a request (a draft model's, an
    EAGLE head's: gpu/eagle_state.py), and the rounds it skips when it did not."""

    offered: bool = False  # proposed after its last token (not yet planned)
    skip: int = 0  # rounds left without proposals: the scheduler declined the last ones
    declines: int = 0  # offers declined in a row (each doubles the skip, up to 16x)

    def follow(self, work: SeqWork, backoff_steps: int) -> None:
        """Whether the scheduler used the proposals offered for this step. It declines them
        for a request it paused, in a step it keeps from proposing (batch size, the cost
        model) or without room: then the request skips its next `backoff_steps` rounds (the
        scheduler's pause is as long), twice as many after each further decline in a row (up
        to 16x: the scheduler's per-step probes back off so), and offers again after."""
        if work.sample and self.skip > 0:
            self.skip -= 1
        if self.offered and work.sample:
            self.offered = False
            if work.draft_token_ids:
                self.declines = 0
            elif not work.reset:
                self.skip = backoff_steps << min(self.declines, 4)
                self.declines += 1


@dataclasses.dataclass(eq=False)
class DraftSeq(Offers):
    computed: int = 0  # positions [0, computed) hold the draft's KV of committed tokens
    known: list[int] = dataclasses.field(default_factory=list)  # committed, from `computed`
    spec: tuple[int, ...] = ()  # fed while proposing, at positions `computed`.. (known empty)

    @property
    def num_tokens(self) -> int:
        """Committed tokens the draft knows of (its next feed ends there)."""
        return self.computed + len(self.known)

    def put(self, pos: int, tokens: tuple[int, ...] | list[int]) -> None:
        """Committed `tokens` at positions pos.. (position-indexed, idempotent)."""
        if not tokens:
            return
        start = pos - self.computed
        if start < 0:  # already in the draft's KV: the same committed tokens
            tokens = tokens[-start:]
            start = 0
            if not tokens:
                return
        if start > len(self.known):  # a gap it never saw: taken as present (docstring)
            self.computed, self.known, self.spec, start = pos, [], (), 0
        if self.spec and not self.known and start == 0:
            matched = 0
            while matched < min(len(self.spec), len(tokens)):
                if self.spec[matched] != tokens[matched]:
                    break
                matched += 1
            self.computed += matched
            tokens = tokens[matched:]
        self.spec = ()
        self.known[start:] = tokens

    def fed(self, num_tokens: int) -> None:
        """The draft's KV now holds the first `num_tokens` known tokens."""
        self.computed += num_tokens
        del self.known[:num_tokens]


class DraftSeqs:
    """Every live request's DraftSeq, updated from each StepPlan and its sampled tokens."""

    def __init__(self, block_size: int, backoff_steps: int = 16) -> None:
        self.block_size = block_size
        self.backoff_steps = backoff_steps
        self.by_id: dict[str, DraftSeq] = {}

    def release(self, request_ids: tuple[str, ...]) -> None:
        for request_id in request_ids:
            self.by_id.pop(request_id, None)

    def clear(self) -> None:
        self.by_id.clear()

    def apply(self, work: SeqWork, num_blocks: int) -> DraftSeq:
        """Fold one SeqWork in; `num_blocks` is the request's table length after it."""
        seq = self.by_id.get(work.request_id)
        if seq is None:
            # a first schedule: positions before start_pos come from the prefix cache
            seq = self.by_id[work.request_id] = DraftSeq(computed=work.start_pos)
        elif work.reset:
            # a new table (recompute, swap-in): what is recomputed is re-fed from start_pos;
            # a swap moved the draft's blocks with the target's (one pair list, both pools)
            seq.spec = ()
            if seq.computed > work.start_pos:
                seq.computed, seq.known = work.start_pos, []
        if work.num_dropped_blocks and seq.spec:  # proposals' KV in the dropped blocks is gone
            kept = (num_blocks - len(work.block_ids)) * self.block_size - seq.computed
            seq.spec = seq.spec[: max(kept, 0)]
        seq.put(work.start_pos, work.token_ids)
        seq.follow(work, self.backoff_steps)
        return seq

    def wants(self, seq: DraftSeq) -> bool:
        """Whether the draft proposes after this request's step."""
        return seq.skip == 0

    def commit(self, seq: DraftSeq, work: SeqWork, token: SampledToken) -> None:
        """The step's committed tokens after `work`: the target's token and accepted ones."""
        seq.put(work.start_pos + len(work.token_ids), (token.token_id, *token.more))
