"""What the phase router remembers of each live request: the block table the plans have built
(so a request that changes executor takes its whole table along), its sampling params (with a
seed, so both executors draw the same stream), the executor holding its state, and, for
requests whose sampling reads history (penalties, multi-token bad words), the tokens each
position holds (the history the sampler reads).
"""

from __future__ import annotations

import dataclasses

from troupe.messages.executor import SeqWork
from troupe.messages.phase_router import Phase
from troupe.messages.sampling import SamplingParams


@dataclasses.dataclass(eq=False)
class PhaseRequest:
    """One request as the router sees it."""

    params: SamplingParams
    num_prompt_tokens: int
    table: list[int] = dataclasses.field(default_factory=list)
    holder: Phase | None = None  # the executor holding its state (params, table, history)
    phase: Phase = Phase.PREFILL  # where its next work runs: prefill until it has sampled
    tokens: list[int] | None = None  # position -> token, only when its params need history

    def __post_init__(self) -> None:
        if self.params.needs_history:
            self.tokens = []

    def apply(self, work: SeqWork) -> None:
        """Fold `work`'s table delta and tokens in, as the executor does (request_states.py)."""
        if work.reset:
            self.table = list(work.block_ids)
        else:
            if work.num_dropped_blocks:
                del self.table[len(self.table) - work.num_dropped_blocks :]
            self.table.extend(work.block_ids)
        if self.tokens is not None:
            if len(self.tokens) < len(work.history):
                self.tokens.extend([0] * (len(work.history) - len(self.tokens)))
            self.tokens[: len(work.history)] = work.history
            end = work.start_pos + len(work.token_ids)
            if len(self.tokens) < end:
                self.tokens.extend([0] * (end - len(self.tokens)))
            self.tokens[work.start_pos : end] = work.token_ids

    def moved_work(self, work: SeqWork) -> SeqWork:
        """`work` for an executor that holds nothing of this request: the whole table, the
        params and the history before it."""
        history = () if self.tokens is None else tuple(self.tokens[: work.start_pos])
        return SeqWork(
            request_id=work.request_id,
            token_ids=work.token_ids,
            start_pos=work.start_pos,
            block_ids=tuple(self.table),
            reset=True,
            sample=work.sample,
            params=self.params,
            num_prompt_tokens=self.num_prompt_tokens,
            history=history,
        )
