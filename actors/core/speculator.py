"""Speculative decoding on the scheduler's side: when to propose, what, and what came of it.

The step planner asks `step_allows` once per step, then `propose` for each decode it plans;
the scheduler reports each verification to `record`. Proposals come from the n-gram proposer
(here, over the request's tokens) or, with a draft model, from the executor: its last
SampledToken for the request carried the draft's `proposals` for the step after it
(gpu/draft_runner.py), which the scheduler keeps in `Request.proposed` until the next decode
is planned. Backoff, so speculation never makes a workload much slower (spec_cost.py is the
cost model, in step tokens):

- per step, fixed: no proposals while `disable_batch_size` or more requests run, nor at a
  batch where even proposals that are all accepted cost more than they save (max_batch);
- per step, measured: the speculator keeps averages of the tokens proposed per decode and of
  the share accepted; when they say a verification step would cost more than the tokens it
  adds (its overhead included), steps go without proposals. After `backoff_steps` such steps
  (doubling while probes fail, up to 16x) it probes: the next step with a decode that could propose asks for proposals (with a draft
  model: the next one it offered proposals for), and the averages move;
- per request: each request keeps an acceptance rate (an exponential average of accepted /
  proposed over its verifications); below `min_acceptance`, or below the share of a step its
  tokens take at this batch size (a proposal accepted less often than that costs more compute
  than it saves), it stops proposing for `backoff_steps` of its decode steps, then probes again
  from halfway between the threshold and 1, so a request whose text stops matching pays about
  two wasted verifications per pause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from troupe.actors.core.ngram_proposer import NgramIndex
from troupe.actors.core.request_state import Request
from troupe.actors.core.step_work import Kind, Work
from troupe.config import EngineConfig, SpeculativeMethod
from troupe.messages.allocator import Shrink
from troupe.messages.common import FinishReason
from troupe.messages.scheduler import SampledToken
from troupe.messages.streamer import SeqOutput
from troupe.spec_cost import SpecCost, batch_limit, spec_cost

if TYPE_CHECKING:
    from troupe.actors.core.step_planner import StepPlanner

RATE_WEIGHT = 0.5  # weight of the newest verification in a request's acceptance rate
STEP_WEIGHT = 0.5  # weight of the newest proposing step in the per-step averages
MAX_HOLD_FACTOR = 16  # probes that keep failing come every backoff_steps .. 16x that steps


@dataclass(frozen=True)
class SpecSettings:
    """The speculative-decoding knobs of EngineConfig; num_tokens 0: off."""

    num_tokens: int = 0
    method: SpeculativeMethod = "ngram"
    min_n: int = 2
    max_n: int = 4
    disable_batch_size: int | None = None
    min_acceptance: float = 0.0
    backoff_steps: int = 16
    cost: SpecCost | None = None  # None: no cost model (only the fixed limits)

    @classmethod
    def from_config(cls, config: EngineConfig) -> SpecSettings:
        return cls(
            num_tokens=config.num_proposals,
            method=config.speculative_method or "ngram",
            min_n=config.prompt_lookup_min,
            max_n=config.prompt_lookup_max,
            disable_batch_size=batch_limit(config),
            min_acceptance=config.speculative_min_acceptance,
            backoff_steps=config.speculative_backoff_steps,
            cost=spec_cost(config) if config.speculative_cost_model else None,
        )


class Speculator:
    """Proposals for the planner, acceptance counts and backoff for the scheduler."""

    def __init__(self, settings: SpecSettings) -> None:
        self.settings = settings
        self.enabled = settings.num_tokens > 0
        self.cost = settings.cost
        self.num_proposed = 0  # proposed tokens verified
        self.num_accepted = 0
        self.accepted_lengths = [0] * (settings.num_tokens + 1)  # verifications per length
        self.num_steps_held = 0  # steps the measured backoff kept from proposing
        self.batch = 0  # running requests in the step being planned
        # The per-step averages (optimistic at first): proposed tokens per decode in steps
        # that could propose, and accepted / proposed over verifications.
        self.per_decode = float(settings.num_tokens)
        self.rate = 1.0
        self._open = False  # the step being planned may propose
        self._probing = False  # open until a step asks for proposals (the probe)
        self._held = 0  # steps held back in a row
        self._hold = settings.backoff_steps  # ... before a probe: doubles while probes fail
        self._decodes = self._proposals = 0  # this open step's propose calls, tokens proposed
        self._verified = self._accepted = 0  # verified since the last step was planned

    def step_allows(self, num_running: int) -> bool:
        """Whether this step may carry proposals at all (the per-step backoff)."""
        probed = self._fold()
        self.batch = num_running
        self._open = False
        limit = self.settings.disable_batch_size
        if not self.enabled or (limit is not None and num_running >= limit):
            return False
        cost, expected = self.cost, self.per_decode * self.rate
        if cost is None or self._probing or cost.pays(num_running, expected, self.per_decode):
            if not self._probing:
                self._hold = self.settings.backoff_steps  # it pays: the next hold is short
            self._open, self._held = True, 0
            return True
        if probed:  # a probe that did not pay: wait longer for the next
            self._hold = min(2 * self._hold, MAX_HOLD_FACTOR * self.settings.backoff_steps)
        self._held += 1
        self.num_steps_held += 1
        if self._held >= self._hold:
            self._probing = True  # the next step probes
        return False

    def _fold(self) -> bool:
        """The last step's counts into the per-step averages; whether it was a probe."""
        probed = False
        if self._verified:
            now = self._accepted / self._verified
            self.rate = STEP_WEIGHT * now + (1 - STEP_WEIGHT) * self.rate
            self._verified = self._accepted = 0
        if self._open and self._decodes:
            now = self._proposals / self._decodes
            self.per_decode = STEP_WEIGHT * now + (1 - STEP_WEIGHT) * self.per_decode
            probed = self._probing  # a step asked for proposals (with a draft: had some)
            self._probing = False
        self._decodes = self._proposals = 0
        return probed

    def propose(self, req: Request, max_tokens: int) -> tuple[int, ...]:
        """Up to min(k, max_tokens) proposals after the request's tokens (its decode step)."""
        s = self.settings
        k = min(s.num_tokens, max_tokens)
        # the token after the last proposal is the target's own: leave room for it
        k = min(k, req.max_total_tokens - req.num_tokens - 1)
        # structured output masks only the target's own row: no proposals to verify unmasked
        if k < 1 or req.params.structured_outputs is not None:
            return ()  # not counted in the per-step averages: nothing could be proposed
        draft_model = s.method in ("draft_model", "eagle", "eagle3", "mtp")  # from the executor
        if draft_model and not req.proposed:
            return ()  # the draft offered none (it skips requests whose offers went unused)
        self._decodes += 1
        if req.spec_paused > 0:
            req.spec_paused -= 1
            return ()
        if draft_model:
            draft = req.proposed[:k]
        else:
            if (index := req.ngrams) is None:
                index = req.ngrams = NgramIndex(s.min_n, s.max_n)
            draft = index.propose(req.token_ids, k)
        self._proposals += len(draft)
        return draft

    def plan_decode(self, planner: StepPlanner, req: Request, budget: int, proposing: bool) -> int:
        """The planner's decode of `req`: proposals that fit the budget and the free blocks (they
        never preempt); blocks only earlier proposals needed go back (Shrink). The budget left."""
        lim, rid = planner.limits, req.request_id
        cover = req.num_computed + 1 + lim.num_lookahead_tokens
        draft = self.propose(req, budget - 1) if proposing else ()
        need = lim.blocks_for(cover + len(draft)) - req.num_blocks
        if draft and need > planner.avail:
            draft, need = (), lim.blocks_for(cover) - req.num_blocks
        if need >= 0:  # the plain decode (which may preempt) or one with proposals that fit
            return planner.fit(req, 1, need, budget, draft=draft)
        req.num_blocks += need  # held for earlier proposals, past everything this step needs
        planner.add_op(Shrink(rid, req.num_blocks * lim.block_size))
        planner.avail -= need
        planner.work[rid] = Work(req, 1 + len(draft), Kind.RUN, 0, draft, -need)
        return budget - 1 - len(draft)

    def record(self, req: Request, num_proposed: int, num_accepted: int) -> None:
        """One verification of `num_proposed` proposals of `req`, `num_accepted` accepted."""
        self.num_proposed += num_proposed
        self.num_accepted += num_accepted
        self.accepted_lengths[num_accepted] += 1
        self._verified += num_proposed
        self._accepted += num_accepted
        rate = RATE_WEIGHT * num_accepted / num_proposed + (1 - RATE_WEIGHT) * req.spec_rate
        threshold = self.settings.min_acceptance
        if self.cost is not None:  # a proposal must pay at least its own compute
            threshold = max(threshold, self.cost.token_share(self.batch))
        if rate < threshold:
            req.spec_paused = self.settings.backoff_steps
            rate = (1.0 + threshold) / 2
        req.spec_rate = rate

    def land(self, req: Request, token: SampledToken, end: int) -> SeqOutput | None:
        """Keep the draft model's proposals for the next step (or none), then apply a
        verification of the request's in-flight proposals (None: none were in flight): the
        accepted ones and the target's next token join its tokens, cut after the first stop
        token or at max_tokens (a finish reason on the output: the caller ends the request)."""
        req.proposed = token.proposals
        if not req.draft:
            return None
        draft, req.draft = req.draft, ()
        accepted = len(token.more)
        new = (token.token_id, *token.more)
        if accepted > len(draft) or new[:accepted] != draft[:accepted]:
            raise ValueError(f"executor accepted {new} for proposals {draft} of {req.request_id}")
        self.record(req, len(draft), accepted)
        kept, reason = len(new), None
        for i, token_id in enumerate(new):  # up to a token that ends the request
            if (reason := req.append_token(token_id)) is not None:
                kept = i + 1
                break
        stop = new[kept - 1] if reason is FinishReason.STOP else None
        # the accepted proposals' KV is the sequence's (as far as it was kept)
        req.num_computed = min(end + accepted, len(req.token_ids))
        logprobs = None
        if token.logprob is not None:
            lps = (token.logprob, *token.more_logprobs)[:kept]
            logprobs = tuple(lp for lp in lps if lp is not None)
        return SeqOutput(req.request_id, new[:kept], reason, stop, logprobs, req.num_cached_tokens)
