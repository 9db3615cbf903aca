"""The rows of a step whose final hidden states are read beyond the sampled rows' logits:
prompt rows scored for their logprobs (gpu/prompt_logprobs.py) and prompt rows pooled into an
embedding (SamplingParams.pooling, messages/pooling.py).

Their indices follow the sampled rows' in `logits_indices`, scored rows first, so the model's
forward returns their hidden states after the sampled rows' (ForwardPass.scored).

    pooling   rows of a chunk at positions start .. start+n-1 of a prompt of P tokens
    last      the row at P - 1, if the chunk holds it
    cls       the row at 0, if the chunk holds it
    mean      the rows at positions < P (the embedding is whole once position P - 1 is in)
    per-token the rows at positions < P, as mean's (token_embed, token_classify: each row kept)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from troupe.gpu.prompt_logprobs import PromptRows, prompt_rows
from troupe.gpu.request_states import RequestState
from troupe.messages import SeqWork
from troupe.messages.pooling import PoolingTask


@dataclasses.dataclass(frozen=True, slots=True)
class PooledSeq:
    request_id: str
    num_rows: int
    first: bool  # the chunk starts the prompt: a sum pooled before (a recompute's) restarts
    done: bool  # the chunk holds the prompt's last position: the embedding is whole
    normalize: bool  # embed: unit norm; classify: the classifier's activation
    task: PoolingTask  # classify tasks go through the score head (gpu/classifier_config.py)

    @property
    def is_per_token(self) -> bool:
        return self.task in ("token_embed", "token_classify")


@dataclasses.dataclass(frozen=True, slots=True)
class PooledRows:
    rows: np.ndarray  # [R] int64: token rows of the step, sequence after sequence
    seqs: tuple[PooledSeq, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class HiddenRows:
    scored: PromptRows | None
    pooled: PooledRows | None

    @property
    def rows(self) -> np.ndarray:
        parts = [r.rows for r in (self.scored, self.pooled) if r is not None]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    @property
    def num_scored(self) -> int:
        return 0 if self.scored is None else len(self.scored.rows)


def hidden_rows(
    seqs: Sequence[SeqWork], states: Sequence[RequestState], query_start_loc: np.ndarray
) -> HiddenRows | None:
    """The rows `seqs` ask for (None: none)."""
    scored = prompt_rows(seqs, query_start_loc, [s.params.prompt_logprobs or 0 for s in states])
    pooled = _pooled_rows(seqs, states, query_start_loc)
    if scored is None and pooled is None:
        return None
    return HiddenRows(scored, pooled)


def _pooled_rows(
    seqs: Sequence[SeqWork], states: Sequence[RequestState], query_start_loc: np.ndarray
) -> PooledRows | None:
    rows: list[np.ndarray] = []
    out: list[PooledSeq] = []
    for i, work in enumerate(seqs):
        pooling = states[i].params.pooling
        if not work.pools or pooling is None:
            continue
        start, n, last = work.start_pos, len(work.token_ids), states[i].num_prompt_tokens - 1
        first_row = int(query_start_loc[i])
        if pooling.type == "mean" or pooling.is_per_token:
            offsets = np.arange(max(0, min(n, last + 1 - start)), dtype=np.int64)
        elif pooling.type == "cls":
            offsets = np.zeros(1 if start == 0 else 0, np.int64)
        else:  # last
            offsets = np.full(1 if start <= last < start + n else 0, last - start, np.int64)
        if not len(offsets):
            continue
        done = start + n > last if pooling.type != "cls" or pooling.is_per_token else True
        rows.append(first_row + offsets)
        out.append(
            PooledSeq(
                work.request_id, len(offsets), start == 0, done, pooling.normalize, pooling.task
            )
        )
    if not out:
        return None
    return PooledRows(np.concatenate(rows), tuple(out))
