"""A decode step launched before its plan (gpu/overlap.py, gpu/forward_ahead.py): whether it
can be, its inputs, and which rows of it a plan turns out to be."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from troupe.gpu.request_states import RequestState, RequestStates
from troupe.gpu.step_inputs import StepInputs, adapter_ids, build_decode_inputs
from troupe.messages import SeqWork


def launchable(
    states: list[RequestState], next_pos: np.ndarray, block_size: int, max_model_len: int
) -> np.ndarray | None:
    """Each state's block count if their next decode at `next_pos` may be launched early:
    None when a table does not cover its position (no lookahead block yet), past
    max_model_len, or when a request wants logprobs (those are read back synchronously)."""
    num_blocks = np.fromiter((s.num_blocks for s in states), np.int64, len(states))
    if (next_pos >= max_model_len).any() or (num_blocks * block_size <= next_pos).any():
        return None
    if any(s.wants_logprobs for s in states):
        return None
    return num_blocks


def fed_decode_inputs(
    states: list[RequestState],
    next_pos: np.ndarray,
    num_blocks: np.ndarray,
    token_ids: list[int] | None,
    request_states: RequestStates,
    block_size: int,
) -> StepInputs:
    """The inputs of a decode launched before its plan, fed `token_ids` from the host (None:
    ids already on the device, which only rows without penalty history take). The fed tokens
    join the history exactly as the next plan's SeqWorks will put them (a rewrite by
    position, so a discarded step leaves nothing wrong)."""
    num_seqs = len(states)
    for i, (state, pos) in enumerate(zip(states, next_pos.tolist(), strict=True)):
        state.num_tokens = pos + 1
        if state.tokens is not None:
            assert token_ids is not None, "penalty history needs the fed tokens on the host"
            state.tokens[pos] = token_ids[i]
    slots = np.fromiter((s.slot for s in states), np.int64, num_seqs)
    host_ids = np.zeros(num_seqs, np.int64) if token_ids is None else np.asarray(token_ids)
    return build_decode_inputs(
        host_ids.astype(np.int64, copy=False),
        next_pos,
        slots,
        num_blocks,
        request_states.tables,
        block_size,
        adapter_ids(states) if request_states.has_adapters else None,
    )


def matching_rows(
    seqs: Sequence[SeqWork], rows: dict[str, int], tokens: list[int], positions: np.ndarray
) -> list[int] | None:
    """Rows of an early-launched batch (request id -> row, the token fed and the position of
    each row), in plan order, if the plan is that step.

    Each SeqWork must be a plain decode of a launched request, fed the token sampled for it
    with the position after, in the launch order; requests may drop out (they ended).
    """
    found = leading_rows(seqs, rows, tokens, positions)
    return found if len(found) == len(seqs) else None


def leading_rows(
    seqs: Sequence[SeqWork], launched: dict[str, int], fed: list[int], at: np.ndarray
) -> list[int]:
    """Rows of the longest prefix of `seqs` that the launched step computed as planned."""
    rows: list[int] = []
    previous = -1
    get, tokens, positions = launched.get, fed, at.tolist()
    for work in seqs:
        row = get(work.request_id)
        if (
            row is None
            or row <= previous
            or work.reset
            or not work.sample
            or work.params is not None
            or work.draft_token_ids  # a verification: its own step
            or work.num_dropped_blocks
            or len(work.token_ids) != 1
            or work.token_ids[0] != tokens[row]
            or work.start_pos != positions[row]
        ):
            break
        rows.append(row)
        previous = row
    return rows


def split_rows(
    seqs: Sequence[SeqWork], launched: dict[str, int], fed: list[int], at: np.ndarray
) -> list[int] | None:
    """Rows of the leading decodes if the plan is the launched step plus work it lacks: at
    least one such decode, and none of the SeqWorks after them belongs to a launched request
    or carries proposals to verify (those run as a step of their own)."""
    rows = leading_rows(seqs, launched, fed, at)
    if not rows or any(
        w.request_id in launched or w.draft_token_ids or w.num_dropped_blocks
        for w in seqs[len(rows) :]
    ):
        return None
    return rows
