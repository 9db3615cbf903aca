"""Per-request executor state, and the flat step inputs built from a StepPlan's deltas.

    plan.seqs:        A(start 0, 5 tokens)      B(start 40, 1 token)   C(start 16, 3 tokens)
    input_ids:        a0 a1 a2 a3 a4             b40                    c16 c17 c18
    query_start_loc:  0                          5                      6           9
    positions:        0  1  2  3  4              40                     16  17  18
    slot_mapping:     table[p // bs] * bs + p % bs, per token, from the owner's block table

Everything is numpy over concatenated arrays: the Python loops run once per sequence, never
once per token.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from troupe.messages import SamplingParams, SeqWork


@dataclasses.dataclass(kw_only=True)
class RequestState:
    """What the executor remembers of a request between steps."""

    params: SamplingParams
    seed: int
    block_table: np.ndarray  # int32 [max_blocks_per_seq]; the first num_blocks are live
    num_blocks: int = 0
    tokens: np.ndarray  # int64 [max_model_len]: token at each position fed so far
    num_tokens: int = 0  # positions 0..num_tokens-1 are known
    num_prompt_tokens: int = 0


@dataclasses.dataclass(kw_only=True)
class StepInputs:
    """Host arrays of one step, ready to copy to the device."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    block_tables: np.ndarray  # [S, width] int32
    seq_lens: np.ndarray  # [S] int32
    query_start_loc: np.ndarray  # [S + 1] int32
    logits_indices: np.ndarray  # [N] int64: last row of each sampled sequence
    sampled_rows: np.ndarray  # [N] int64: which seqs (plan order) sample
    max_query_len: int
    max_seq_len: int

    @property
    def is_decode(self) -> bool:
        return self.max_query_len == 1


def apply_seq_updates(
    seqs: tuple[SeqWork, ...],
    states: dict[str, RequestState],
    *,
    max_model_len: int,
    max_blocks_per_seq: int,
    block_size: int,
    new_seed: object,
) -> list[RequestState]:
    """Fold each SeqWork's delta (blocks, params, tokens) into its request's state."""
    out = []
    for work in seqs:
        state = states.get(work.request_id)
        if state is None:
            if work.params is None:
                raise ValueError(f"request {work.request_id!r}: first SeqWork carries no params")
            seed = work.params.seed if work.params.seed is not None else new_seed()  # type: ignore[operator]
            state = RequestState(
                params=work.params,
                seed=int(seed),
                block_table=np.zeros(max_blocks_per_seq, dtype=np.int32),
                tokens=np.zeros(max_model_len, dtype=np.int64),
            )
            states[work.request_id] = state
        elif work.params is not None:
            state.params = work.params
        end = work.start_pos + len(work.token_ids)
        if end > max_model_len:
            raise ValueError(
                f"request {work.request_id!r}: position {end - 1} is past max_model_len "
                f"{max_model_len}"
            )
        first = 0 if work.reset else state.num_blocks
        if first + len(work.block_ids) > max_blocks_per_seq:
            raise ValueError(
                f"request {work.request_id!r}: {first + len(work.block_ids)} blocks exceed "
                f"max_model_len / block_size = {max_blocks_per_seq}"
            )
        state.block_table[first : first + len(work.block_ids)] = work.block_ids
        state.num_blocks = first + len(work.block_ids)
        if -(-end // block_size) > state.num_blocks:
            raise ValueError(
                f"request {work.request_id!r}: {end} tokens need {-(-end // block_size)} blocks, "
                f"its table has {state.num_blocks}"
            )
        state.tokens[work.start_pos : end] = work.token_ids
        state.num_tokens = end
        if work.num_prompt_tokens:
            state.num_prompt_tokens = work.num_prompt_tokens
        out.append(state)
    return out


def build_step_inputs(
    seqs: tuple[SeqWork, ...], states: list[RequestState], block_size: int, width: int | None
) -> StepInputs:
    """Flat arrays for the forward; block tables padded to `width` (or the widest table)."""
    num_seqs = len(seqs)
    lens = np.fromiter((len(w.token_ids) for w in seqs), np.int64, num_seqs)
    starts = np.fromiter((w.start_pos for w in seqs), np.int64, num_seqs)
    total = int(lens.sum())
    input_ids = np.fromiter(
        itertools.chain.from_iterable(w.token_ids for w in seqs), np.int64, total
    )
    qsl = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(lens, out=qsl[1:])
    owner = np.repeat(np.arange(num_seqs), lens)
    positions = np.arange(total, dtype=np.int64) - qsl[owner] + starts[owner]
    num_blocks = np.fromiter((s.num_blocks for s in states), np.int64, num_seqs)
    width = width if width is not None else max(1, int(num_blocks.max(initial=1)))
    tables = np.zeros((num_seqs, width), dtype=np.int32)
    for row, state in enumerate(states):
        tables[row, : state.num_blocks] = state.block_table[: state.num_blocks]
    slots = tables[owner, positions // block_size].astype(np.int64) * block_size
    slots += positions % block_size
    sampled = np.fromiter((w.sample for w in seqs), bool, num_seqs)
    sampled_rows = np.flatnonzero(sampled)
    seq_lens = (starts + lens).astype(np.int32)
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slots,
        block_tables=tables,
        seq_lens=seq_lens,
        query_start_loc=qsl.astype(np.int32),
        logits_indices=qsl[1:][sampled_rows] - 1,
        sampled_rows=sampled_rows,
        max_query_len=int(lens.max(initial=0)),
        max_seq_len=int(seq_lens.max(initial=0)),
    )
