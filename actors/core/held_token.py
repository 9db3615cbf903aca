"""Held-back prompt tokens: with an overlapping runner (a lookahead), a prompt whose last chunk
joins a step with decodes computes all but its last token, which its SeqWork names
(next_token); its table covers that token too. The next step computes the token as a decode,
which the runner has already sampled with the decodes' early-launched step
(gpu/overlap_merge.py): a joining prompt costs the decodes its compute, not a forward of its
own, and its first token comes one decode step later. Off with disaggregation (the prefill
side samples a prompt's first token) and speculative decoding (the scheduler's switch);
not for StreamingLLM, structured or prompt-scoring requests (their steps are not overlapped
that way)."""

from __future__ import annotations

from troupe.actors.core.request_state import Request


def holds_last_token(req: Request, end: int) -> bool:
    """Whether `req`'s chunk ending at `end`, beside decodes, holds back its last token."""
    return (
        end == req.compute_end == req.num_tokens
        and end - req.num_computed >= 2
        and not req.stream_window
        and req.params.structured_outputs is None
        and req.params.prompt_logprobs is None  # its last prompt position is scored
        and req.params.pooling is None  # or pooled
        and req.embeds is None  # its last position is a row, not a token a decode can feed
    )
