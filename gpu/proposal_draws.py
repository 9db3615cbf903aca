"""What every proposer in the executor (the draft model, gpu/draft_runner.py; an EAGLE head,
gpu/eagle_runner.py) does alike around its own forwards: keep each request's history current
for the draws' penalties, draw proposals with the request's settings and the target's noise,
gather a round's draws per row, and attach them to the step's SampledTokens."""

from __future__ import annotations

import numpy as np
import torch
from troupe.gpu.request_states import RequestState
from troupe.gpu.sampler import sample
from troupe.gpu.sampling_batch import build_sampling_batch
from troupe.messages import SampledToken, SeqWork


def record_sampled(work: SeqWork, state: RequestState, token: SampledToken) -> None:
    """The step's sampled tokens into the state's history (penalties read it up to each draw)."""
    if state.tokens is None:
        return
    end = work.start_pos + len(work.token_ids)
    new = (token.token_id, *token.more)[: len(state.tokens) - end]
    state.tokens[end : end + len(new)] = new


def draw(
    logits: torch.Tensor, states: list[RequestState], vocab_size: int, offsets: np.ndarray
) -> torch.Tensor:
    """Draws at each state's num_tokens + offset: its settings, the target's noise."""
    batch = build_sampling_batch(states, vocab_size, logits.device, offsets)
    batch.num_logprobs = (None,) * len(states)  # proposals carry no logprobs
    ids, _ = sample(logits, batch)
    return ids.clamp_(0, vocab_size - 1)  # a token id even from non-finite logits


def tokens_by_row(steps: list[tuple[np.ndarray, torch.Tensor]], num_rows: int) -> list[list[int]]:
    """A round's draws, step by step (the rows still drawing, their ids), as each row's list;
    one read-back for the whole round."""
    values = torch.cat([ids for _, ids in steps]).tolist()
    drawn: list[list[int]] = [[] for _ in range(num_rows)]
    first = 0
    for rows, ids in steps:
        for row, token in zip(rows.tolist(), values[first : first + len(ids)], strict=True):
            drawn[row].append(token)
        first += len(ids)
    return drawn


def with_proposals(
    sampled: tuple[SampledToken, ...], proposals: dict[str, tuple[int, ...]]
) -> tuple[SampledToken, ...]:
    """`sampled` (the step's tokens, plan order) with each request's proposals attached."""
    if not proposals:
        return sampled
    return tuple(
        SampledToken(
            t.request_id,
            t.token_id,
            t.logprob,
            t.more,
            t.more_logprobs,
            proposals.get(t.request_id, ()),
        )
        for t in sampled
    )


def record_draws(
    states: list[RequestState], rows: np.ndarray, ids: torch.Tensor, positions: np.ndarray
) -> None:
    """Each row's latest draw into its state's history at `positions` (penalties: the next
    draw counts it; reading the ids syncs with the device)."""
    for row, token, pos in zip(rows.tolist(), ids.tolist(), positions.tolist(), strict=True):
        if (tokens := states[row].tokens) is not None:
            tokens[pos] = token
