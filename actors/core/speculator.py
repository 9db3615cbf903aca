"""Speculative decoding on the scheduler's side: when to propose, what, and what came of it.

The step planner asks `propose` for each decode it plans; the scheduler reports each
verification to `record`. Proposals come from the n-gram proposer (here, over the request's
tokens) or, with a draft model, from the executor: its last SampledToken for the request
carried the draft's `proposals` for the step after it (gpu/draft_runner.py), which the
scheduler keeps in `Request.proposed` until the next decode is planned. Backoff, so speculation never makes a workload much slower:

- per step: no proposals while `disable_batch_size` or more requests run (verifying k + 1
  tokens per request costs more than it saves once a step is compute-bound);
- per request: each request keeps an acceptance rate (an exponential average of accepted /
  proposed over its verifications); below `min_acceptance` it stops proposing for
  `backoff_steps` of its decode steps, then probes again from halfway between the threshold and 1, so a
  request whose text stops matching pays about two wasted verifications per pause.
"""

from __future__ import annotations

from dataclasses import dataclass

from troupe.actors.core.ngram_proposer import NgramIndex
from troupe.actors.core.request_state import Request
from troupe.config import EngineConfig, SpeculativeMethod
from troupe.messages.scheduler import SampledToken
from troupe.messages.streamer import SeqOutput

RATE_WEIGHT = 0.5  # weight of the newest verification in a request's acceptance rate


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

    @classmethod
    def from_config(cls, config: EngineConfig) -> SpecSettings:
        return cls(
            num_tokens=config.num_proposals,
            method=config.speculative_method or "ngram",
            min_n=config.prompt_lookup_min,
            max_n=config.prompt_lookup_max,
            disable_batch_size=config.speculative_disable_by_batch_size,
            min_acceptance=config.speculative_min_acceptance,
            backoff_steps=config.speculative_backoff_steps,
        )


class Speculator:
    """Proposals for the planner, acceptance counts and backoff for the scheduler."""

    def __init__(self, settings: SpecSettings) -> None:
        self.settings = settings
        self.enabled = settings.num_tokens > 0
        self.num_proposed = 0  # proposed tokens verified
        self.num_accepted = 0
        self.accepted_lengths = [0] * (settings.num_tokens + 1)  # verifications per length

    def step_allows(self, num_running: int) -> bool:
        """Whether this step may carry proposals at all (the per-step backoff)."""
        limit = self.settings.disable_batch_size
        return self.enabled and (limit is None or num_running < limit)

    def propose(self, req: Request, max_tokens: int) -> tuple[int, ...]:
        """Up to min(k, max_tokens) proposals after the request's tokens (its decode step)."""
        if req.spec_paused > 0:
            req.spec_paused -= 1
            return ()
        s = self.settings
        k = min(s.num_tokens, max_tokens)
        # the token after the last proposal is the target's own: leave room for it
        k = min(k, req.max_total_tokens - req.num_tokens - 1)
        # structured output masks only the target's own row: no proposals to verify unmasked
        if k < 1 or req.params.structured_outputs is not None:
            return ()
        if s.method == "draft_model":
            return req.proposed[:k]
        if (index := req.ngrams) is None:
            index = req.ngrams = NgramIndex(s.min_n, s.max_n)
        return index.propose(req.token_ids, k)

    def record(self, req: Request, num_proposed: int, num_accepted: int) -> None:
        """One verification of `num_proposed` proposals of `req`, `num_accepted` accepted."""
        self.num_proposed += num_proposed
        self.num_accepted += num_accepted
        self.accepted_lengths[num_accepted] += 1
        rate = RATE_WEIGHT * num_accepted / num_proposed + (1 - RATE_WEIGHT) * req.spec_rate
        if rate < self.settings.min_acceptance:
            req.spec_paused = self.settings.backoff_steps
            rate = (1.0 + self.settings.min_acceptance) / 2
        req.spec_rate = rate

    def land(self, req: Request, token: SampledToken, end: int) -> SeqOutput:
        """Apply a verification of the request's in-flight proposals: the accepted ones and
        the target's next token join its tokens, cut after the first stop token or at
        max_tokens (a finish reason on the output: the caller ends the request)."""
        draft, req.draft = req.draft, ()
        accepted = len(token.more)
        new = (token.token_id, *token.more)
        if accepted > len(draft) or new[:accepted] != draft[:accepted]:
            raise ValueError(f"executor accepted {new} for proposals {draft} of {req.request_id}")
        self.record(req, len(draft), accepted)
        kept, reason, stop = req.append_tokens(new)
        # the accepted proposals' KV is the sequence's (as far as it was kept)
        req.num_computed = min(end + accepted, len(req.token_ids))
        logprobs = None
        if token.logprob is not None:
            lps = (token.logprob, *token.more_logprobs)[:kept]
            logprobs = tuple(lp for lp in lps if lp is not None)
        return SeqOutput(req.request_id, new[:kept], reason, stop, logprobs, req.num_cached_tokens)
