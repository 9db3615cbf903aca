"""Prompt logprobs (SamplingParams.prompt_logprobs): each prompt token's logprob given the
tokens before it, from the logits of the row before it.

The scheduler marks the rows of a chunk to score (SeqWork.num_scored, with the prompt token
after the chunk in `after_chunk`). Their hidden states come out of the forward after the
sampled rows' (their indices appended to `logits_indices`: gpu/step_inputs.py), and are turned
into logits a slice at a time here, so a long chunk never holds [chunk, vocab] logits at once.
They are of the raw logits (log_softmax before temperature, penalties or filters) whatever
EngineConfig.logprobs_mode says, as vLLM's: a prompt token goes through no processor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import torch
from troupe.messages import PromptLogprobs, SeqWork, TokenLogprob

SLICE_ROWS = 256  # logits rows alive at once: 256 x 151,936 fp32 is 156 MB


@dataclasses.dataclass(frozen=True, slots=True)
class ScoredChunk:
    request_id: str
    start: int  # position of its first target token
    num_rows: int
    top_n: int  # alternatives listed per position


@dataclasses.dataclass(frozen=True, slots=True)
class PromptRows:
    """A step's scored rows: where they are in the step's tokens, and what each is scored by."""

    rows: np.ndarray  # [R] int64: token rows of the step, chunk after chunk
    targets: np.ndarray  # [R] int64: the prompt token each row's logprob is of
    chunks: tuple[ScoredChunk, ...]


def prompt_rows(
    seqs: Sequence[SeqWork], query_start_loc: np.ndarray, top_n: Sequence[int]
) -> PromptRows | None:
    """The rows `seqs` ask to score (None: none); `top_n[i]`: seqs[i]'s prompt_logprobs."""
    rows: list[np.ndarray] = []
    targets: list[int] = []
    chunks: list[ScoredChunk] = []
    for i, work in enumerate(seqs):
        n = work.num_scored
        if not n:
            continue
        after = (work.after_chunk,) if work.after_chunk >= 0 else ()
        wanted = (work.token_ids[1:] + after)[:n]
        if len(wanted) != n:
            raise ValueError(
                f"{work.request_id}: {n} rows to score, but only {len(wanted)} known targets"
            )
        first = int(query_start_loc[i])
        rows.append(np.arange(first, first + n, dtype=np.int64))
        targets.extend(wanted)
        chunks.append(ScoredChunk(work.request_id, work.start_pos + 1, n, top_n[i]))
    if not chunks:
        return None
    return PromptRows(np.concatenate(rows), np.asarray(targets, np.int64), tuple(chunks))


def score_prompt_rows(
    hidden: torch.Tensor,
    scored: PromptRows,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    slice_rows: int = SLICE_ROWS,
) -> tuple[PromptLogprobs, ...]:
    """Each chunk's PromptLogprobs from the scored rows' final hidden states [R, hidden]."""
    targets = torch.from_numpy(scored.targets).to(hidden.device)
    top_n = max(c.top_n for c in scored.chunks)
    chosen: list[float] = []
    ranks: list[int] = []
    top_ids: list[list[int]] = []
    top_values: list[list[float]] = []
    for lo in range(0, len(targets), slice_rows):
        hi = min(lo + slice_rows, len(targets))
        logprobs = compute_logits(hidden[lo:hi]).float().log_softmax(dim=-1)
        picked = logprobs.gather(1, targets[lo:hi, None])
        chosen += picked[:, 0].tolist()
        ranks += (logprobs >= picked).sum(dim=-1).tolist()  # vLLM's rank: ties count
        if top_n:
            values, ids = logprobs.topk(top_n, dim=-1)
            top_values += values.tolist()
            top_ids += ids.tolist()
    target_ids = scored.targets.tolist()
    out: list[PromptLogprobs] = []
    row = 0
    for chunk in scored.chunks:
        k = chunk.top_n
        entries = tuple(
            TokenLogprob(
                target_ids[r],
                chosen[r],
                tuple(zip(top_ids[r][:k], top_values[r][:k], strict=True)) if k else (),
                ranks[r],
            )
            for r in range(row, row + chunk.num_rows)
        )
        out.append(PromptLogprobs(chunk.request_id, chunk.start, entries))
        row += chunk.num_rows
    return tuple(out)
