"""A split merged into the decodes' next step (overlap scheduling: gpu/overlap.py).

A plan that is the pending step's decodes plus prefill chunks that sample nothing (a long
prompt's middle chunk, or a prompt's last chunk without its last token, which the scheduler
holds back when the prompt joins running decodes: actors/core/step_planner.py) would run the
chunks as a forward of their own after the decodes' next step. A small model's forward costs
~1.5 ms on the H200 whatever it carries (28 layers of launches), and the decodes' next token
waited for it: that was the inter-token tail of a server taking new prompts (issue 9). Here
the chunks join the decodes' next step instead, as one forward:

    plan N+1:  decodes D (the pending step answered them) + E's last chunk, its token t held back
    forward:   D's next decodes (fed the pending samples on the device) + the chunk + t,
               sampling D's rows and t's row: E's first token, "sampled ahead"
    plan N+2:  D's decodes + E's decode of t: the merged step answers every one (a hit)

The decodes wait for the chunk's compute, not for a second forward. E's first token comes one
step later than if its chunk had sampled in step N+1 (a decode step, ~2 ms), and its KV is
the same: the positions, the tokens and the context are, only the step that writes them moves.
"""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
from troupe.gpu.request_states import RequestState, RequestStates
from troupe.gpu.step_inputs import StepInputs, build_step_inputs
from troupe.messages import SeqWork


def mergeable(
    decodes: tuple[SeqWork, ...],
    states: RequestStates,
    next_pos: np.ndarray,
    block_size: int,
    max_model_len: int,
) -> np.ndarray | None:
    """The decodes' block counts after this plan if their next step can take the plan's
    chunks: fed on the device (no penalty history, no logprobs), its KV slot owned, within
    max_model_len. None otherwise (checked before the plan is applied: nothing to undo)."""
    found = [states.by_id.get(w.request_id) for w in decodes]
    if any(s is None or s.tokens is not None or s.wants_logprobs for s in found):
        return None
    num_blocks = np.fromiter(
        (s.num_blocks + len(w.block_ids) for s, w in zip(found, decodes, strict=True) if s),
        np.int64,
        len(decodes),
    )
    if (next_pos >= max_model_len).any() or (num_blocks * block_size <= next_pos).any():
        return None
    return num_blocks


@dataclasses.dataclass(kw_only=True, eq=False)
class MergedChunks:
    """The plan's chunks as the second part of a merged step."""

    inputs: StepInputs
    states: list[RequestState]  # of the rows that sample (held-back tokens), in order
    request_ids: list[str]
    positions: np.ndarray  # int64 per sampling row: the position it computes
    fed: list[int]  # per sampling row: the held-back token it was fed


def merged_chunks(
    extras: tuple[SeqWork, ...], states: RequestStates, block_size: int
) -> MergedChunks:
    """Apply the chunks, each with its held-back token (SeqWork.next_token) appended and
    sampled unless it wants logprobs (read back with the step, not ahead): their inputs."""
    fed = tuple(
        msgspec.structs.replace(w, token_ids=(*w.token_ids, w.next_token), sample=True)
        if w.next_token >= 0 and not _wants_logprobs(w, states)
        else w
        for w in extras
    )
    chunk_states = states.apply(fed)
    inputs = build_step_inputs(
        fed, chunk_states, states.tables, block_size, adapters=states.has_adapters
    )
    rows = inputs.sampled_rows.tolist()
    return MergedChunks(
        inputs=inputs,
        states=[chunk_states[r] for r in rows],
        request_ids=[fed[r].request_id for r in rows],
        positions=inputs.seq_lens[rows].astype(np.int64) - 1,
        fed=[fed[r].next_token for r in rows],
    )


def _wants_logprobs(work: SeqWork, states: RequestStates) -> bool:
    if work.params is not None:
        return work.params.logprobs is not None
    state = states.by_id.get(work.request_id)
    return state is not None and state.wants_logprobs
