"""When speculative proposals pay: verification against plain decoding, in step tokens.

A step costs a fixed part (the host's planning, launches, the weights read once per step)
worth `fixed_tokens` tokens, plus the tokens it computes; a step that verifies proposals
costs `overhead` decode steps more (a mixed-step graph instead of a decode graph, no overlap
after it, and with a draft model the draft's round):

    decode step of B sequences            cost  F + B                      output  B
    verification, P proposals, A accepted cost  F + B + P + overhead (F + B)  output  B + A

In units of that decode step, proposals pay when

    1 + a  >  1 + p u + overhead        a, p: accepted and proposed tokens per decode,
                                        u = B / (F + B), the share of a step that is tokens

so a proposed token must be accepted with probability above u to pay its own compute (the
per-request threshold), and a step's proposals together must also cover the overhead (the
per-step decision). u grows with the batch: at F = 128 a token needs 6% acceptance at
batch 8, 33% at 64, 67% at 256; `max_batch` is where even accepting every proposal loses.
Defaults from the H200 figures of 2026-12-02 (Qwen3-0.6B shape, docs/benchmarks.md): a
batch-1 verification cost 1.42 decode steps, a draft round (4-layer draft, k = 4) about 1.3
more; decode steps of 8 and 256 sequences cost 1.83 and 5.50 ms (F ~ 128 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from troupe.config import EngineConfig


@dataclass(frozen=True)
class SpecCost:
    """The cost model for `num_tokens` proposals per decode (k)."""

    num_tokens: int
    fixed_tokens: int = 128  # F: a step's fixed cost, in tokens computed
    overhead: float = 0.4  # extra cost of a verification step, in decode steps

    def token_share(self, batch: int) -> float:
        """u: the share of a decode step of `batch` sequences spent on its tokens; a proposal
        must be accepted with a higher probability to pay for itself."""
        return batch / (self.fixed_tokens + batch)

    def pays(self, batch: int, accepted: float, proposed: float) -> bool:
        """Whether a step of `batch` decodes that propose `proposed` tokens per decode, of
        which `accepted` are expected to be accepted, beats the plain decode step."""
        if proposed <= 0:
            return False
        return accepted > proposed * self.token_share(batch) + self.overhead

    def max_batch(self) -> int:
        """The largest batch at which proposals can pay at all (every one accepted): above
        it no step proposes and a draft model runs no round. 0: never."""
        k, o = self.num_tokens, self.overhead
        if k <= o:
            return 0
        # k > k B / (F + B) + o  <=>  B < F (k - o) / o
        bound = self.fixed_tokens * (k - o) / o if o > 0 else float("inf")
        top = int(bound) - (int(bound) == bound)  # strictly below the bound
        return max(min(top, 1 << 30), 0)


def spec_cost(config: EngineConfig) -> SpecCost:
    """The cost model of a config's speculative method (a draft model adds its round)."""
    overhead = config.speculative_verify_overhead
    if config.executor_proposes:  # a draft model's or an EAGLE head's round
        overhead += config.speculative_draft_overhead
    return SpecCost(config.num_proposals, config.speculative_step_fixed_tokens, overhead)


def batch_limit(config: EngineConfig) -> int | None:
    """No proposals (and no draft round) in a step of this many sequences or more: the
    configured speculative_disable_by_batch_size, or where the cost model says even accepted
    proposals lose, whichever is smaller (without the cost model: the setting). None: none."""
    limit = config.speculative_disable_by_batch_size
    if config.num_proposals == 0 or not config.speculative_cost_model:
        return limit
    top = spec_cost(config).max_batch() + 1
    return top if limit is None else min(limit, top)
