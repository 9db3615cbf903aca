"""What every proposer in the executor (the draft model, gpu/draft_runner.py; an EAGLE head,
gpu/eagle_runner.py) does alike around its own forwards: keep each request's history current
for the draws' penalties, draw proposals with the request's settings and the target's noise,
run a round's decode steps after the first draw (draw_rounds), gather its draws per row, and
attach them to the step's SampledTokens."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from troupe.gpu.device_inputs import host_to_device
from troupe.gpu.request_states import RequestState
from troupe.gpu.sampler import sample
from troupe.gpu.sampling_batch import build_sampling_batch
from troupe.gpu.step_inputs import StepInputs, build_decode_inputs
from troupe.messages import SampledToken, SeqWork

# a proposer's decode step: (the inputs of e_j's rows, their positions, e_j's ids, the rows
# kept on the device when some stopped drawing, else None) -> the logits that draw e_(j+1)
DecodeStep = Callable[[StepInputs, np.ndarray, torch.Tensor, torch.Tensor | None], torch.Tensor]


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


def draw_rounds(
    logits: torch.Tensor,
    states: list[RequestState],
    ks: np.ndarray,
    base: np.ndarray,
    step: DecodeStep,
    *,
    lag: int,
    vocab_size: int,
    tables: np.ndarray,
    block_size: int,
) -> list[list[int]]:
    """Each row's ks[row] draws: e1 from `logits` at position base[row], then e(j+1) at
    base + j from `step` fed e_j, whose row sits at base + j - lag (the draft model's: 1, at
    e_j's own position; an EAGLE head's: 2); one read-back at the end."""
    n = len(states)
    counts = np.fromiter((s.num_tokens for s in states), np.int64, n)
    slots = np.fromiter((s.slot for s in states), np.int64, n)
    num_blocks = np.fromiter((s.num_blocks for s in states), np.int64, n)
    history = any(s.tokens is not None for s in states)
    active = np.arange(n)
    ids = draw(logits, states, vocab_size, base - counts)
    steps: list[tuple[np.ndarray, torch.Tensor]] = [(active, ids)]
    for j in range(1, int(ks.max())):
        if history:  # penalties: the next draw counts this one (a sync per step)
            record_draws(states, active, ids, base[active] + j - 1)
        keep = np.flatnonzero(ks[active] > j)
        kept = None
        if len(keep) < len(active):
            kept = host_to_device(keep, ids.device)
            ids = ids[kept]
            active = active[keep]
        positions = base[active] + j - lag
        inputs = build_decode_inputs(
            np.zeros(len(active), np.int64),
            positions,
            slots[active],
            num_blocks[active],
            tables,
            block_size,
        )
        logits = step(inputs, positions, ids, kept)
        ids = draw(
            logits, [states[r] for r in active], vocab_size, base[active] + j - counts[active]
        )
        steps.append((active, ids))
    return tokens_by_row(steps, n)


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
