"""The flat step inputs of one StepPlan, built from the requests' states.

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
from troupe.gpu.embed_rows import StepEmbeds, join_embeds, step_embeds
from troupe.gpu.hidden_rows import HiddenRows, hidden_rows
from troupe.gpu.request_states import RequestState
from troupe.messages import SeqWork


@dataclasses.dataclass(frozen=True)
class StreamingInputs:
    """Host arrays of a step's StreamingLLM sequences (kernels/streaming_attention.py)."""

    windows: np.ndarray  # [S] int32; 0: the sequence does not stream
    sink_tokens: np.ndarray  # [S] int32
    cache_positions: np.ndarray  # [T] int64: where each query meets the sinks


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
    num_decode_prefix: int = 0  # leading sequences with one new token each
    # Speculative decoding: logits rows per sampled sequence (1 + its proposals), None when
    # no sequence carries proposals (one row each)
    num_logits: np.ndarray | None = None
    streaming: StreamingInputs | None = None  # StreamingLLM sequences (streaming_inputs)
    # Rows whose final hidden states are read (gpu/hidden_rows.py: prompt logprobs, pooling):
    # their indices follow the sampled rows' in logits_indices; such a step runs eagerly
    hidden_rows: HiddenRows | None = None
    # LoRA: each sequence's adapter id (RequestState.adapter; -1: none), None when the engine
    # has no adapters (gpu/lora_runtime.py maps them to slots)
    adapters: np.ndarray | None = None
    # Rows fed an embeddings prompt's rows instead of their tokens' embeddings
    # (gpu/embed_rows.py); None when no sequence carries any
    embeds: StepEmbeds | None = None

    @property
    def is_decode(self) -> bool:
        return self.max_query_len == 1


def build_step_inputs(
    seqs: tuple[SeqWork, ...],
    states: list[RequestState],
    tables: np.ndarray,
    block_size: int,
    *,
    reads_hidden: bool = False,
    adapters: bool = False,
) -> StepInputs:
    """Flat arrays for the forward; block tables cut to the widest live table.

    `tables` is RequestStates.tables: each state's row, zero past its num_blocks. `adapters`:
    the engine has LoRA adapters (RequestStates.has_adapters): fill StepInputs.adapters.
    """
    num_seqs = len(seqs)
    lens = np.fromiter((len(w.token_ids) for w in seqs), np.int64, num_seqs)
    drafts = np.fromiter((len(w.draft_token_ids) for w in seqs), np.int64, num_seqs)
    has_drafts = bool(drafts.any())
    if has_drafts:
        lens += drafts
    starts = np.fromiter((w.start_pos for w in seqs), np.int64, num_seqs)
    slots = np.fromiter((s.slot for s in states), np.int64, num_seqs)
    num_blocks = np.fromiter((s.num_blocks for s in states), np.int64, num_seqs)
    total = int(lens.sum())
    if total == num_seqs:  # pure decode: one token each, no owner map needed
        input_ids = np.fromiter((w.token_ids[0] for w in seqs), np.int64, num_seqs)
        qsl = np.arange(num_seqs + 1, dtype=np.int64)
        positions = starts
        owner = np.arange(num_seqs)
    else:
        fed = (w.token_ids + w.draft_token_ids for w in seqs) if has_drafts else None
        input_ids = np.fromiter(
            itertools.chain.from_iterable(fed or (w.token_ids for w in seqs)), np.int64, total
        )
        qsl = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(lens, out=qsl[1:])
        owner = np.repeat(np.arange(num_seqs), lens)
        positions = np.arange(total, dtype=np.int64) - qsl[owner] + starts[owner]
    width = max(1, int(num_blocks.max(initial=1)))
    step_tables = tables[:, :width][slots]
    slot_mapping = step_tables[owner, positions // block_size].astype(np.int64) * block_size
    slot_mapping += positions % block_size
    sampled = np.fromiter((w.sample for w in seqs), bool, num_seqs)
    sampled_rows = np.flatnonzero(sampled)
    seq_lens = (starts + lens).astype(np.int32)
    ones = lens == 1
    logits_indices = qsl[1:][sampled_rows] - 1
    num_logits = None
    if has_drafts:  # each sampled sequence's last 1 + d rows
        num_logits = 1 + drafts[sampled_rows]
        offsets = np.arange(int(num_logits.sum())) - np.repeat(np.cumsum(num_logits), num_logits)
        logits_indices = np.repeat(logits_indices, num_logits) + offsets + 1
    extra = None
    if reads_hidden:  # rows to score or pool (StepPlan.reads_hidden): after the sampled
        extra = hidden_rows(seqs, states, qsl)
        if extra is not None:
            logits_indices = np.concatenate([logits_indices, extra.rows])
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        block_tables=step_tables,
        seq_lens=seq_lens,
        query_start_loc=qsl.astype(np.int32),
        logits_indices=logits_indices,
        sampled_rows=sampled_rows,
        max_query_len=int(lens.max(initial=0)),
        max_seq_len=int(seq_lens.max(initial=0)),
        num_decode_prefix=num_seqs if ones.all() else int(ones.argmin()),
        num_logits=num_logits,
        hidden_rows=extra,
        adapters=adapter_ids(states) if adapters else None,
        embeds=step_embeds(seqs, qsl),
    )


def adapter_ids(states: list[RequestState]) -> np.ndarray:
    """Each state's LoRA adapter id (-1: none)."""
    return np.fromiter((s.adapter for s in states), np.int32, len(states))


def build_decode_inputs(
    input_ids: np.ndarray,
    positions: np.ndarray,
    slots: np.ndarray,
    num_blocks: np.ndarray,
    tables: np.ndarray,
    block_size: int,
    adapters: np.ndarray | None = None,
) -> StepInputs:
    """A pure-decode step from arrays (one token per sequence, every sequence samples).

    The overlapped step's inputs: no SeqWork to read, so nothing here loops per sequence.
    `slots` index RequestStates.tables; `num_blocks` is each table's live length.
    """
    num_seqs = len(input_ids)
    positions = positions.astype(np.int64, copy=False)
    width = max(1, int(num_blocks.max(initial=1)))
    step_tables = tables[:, :width][slots]
    rows = np.arange(num_seqs)
    slot_mapping = step_tables[rows, positions // block_size].astype(np.int64) * block_size
    slot_mapping += positions % block_size
    seq_lens = (positions + 1).astype(np.int32)
    return StepInputs(
        input_ids=input_ids.astype(np.int64, copy=False),
        positions=positions,
        slot_mapping=slot_mapping,
        block_tables=step_tables,
        seq_lens=seq_lens,
        query_start_loc=np.arange(num_seqs + 1, dtype=np.int32),
        logits_indices=rows.astype(np.int64),
        sampled_rows=rows.astype(np.int64),
        max_query_len=1,
        max_seq_len=int(seq_lens.max(initial=0)),
        num_decode_prefix=num_seqs,
        adapters=adapters,
    )


def concat_inputs(first: StepInputs, second: StepInputs) -> StepInputs:
    """One step of `first`'s sequences, then `second`'s (a merged split: gpu/overlap_merge.py);
    tables padded to the wider. Neither may carry proposals or streaming arrays."""
    assert first.num_logits is None and second.num_logits is None, "no proposals here"
    assert first.streaming is None and second.streaming is None, "no streaming here"
    assert first.hidden_rows is None and second.hidden_rows is None, "no hidden rows here"
    num_tokens, num_seqs = len(first.input_ids), len(first.seq_lens)
    width = max(first.block_tables.shape[1], second.block_tables.shape[1])
    tables = np.zeros((num_seqs + len(second.seq_lens), width), dtype=first.block_tables.dtype)
    tables[:num_seqs, : first.block_tables.shape[1]] = first.block_tables
    tables[num_seqs:, : second.block_tables.shape[1]] = second.block_tables
    adapters = None
    if first.adapters is not None or second.adapters is not None:
        adapters = np.concatenate([_adapters_or_none(first), _adapters_or_none(second)])
    leading = first.num_decode_prefix
    if leading == num_seqs:  # every sequence of `first` has one token: `second`'s lead on
        leading += second.num_decode_prefix
    return StepInputs(
        input_ids=np.concatenate([first.input_ids, second.input_ids]),
        positions=np.concatenate([first.positions, second.positions]),
        slot_mapping=np.concatenate([first.slot_mapping, second.slot_mapping]),
        block_tables=tables,
        seq_lens=np.concatenate([first.seq_lens, second.seq_lens]),
        query_start_loc=np.concatenate(
            [first.query_start_loc[:-1], second.query_start_loc + num_tokens]
        ).astype(np.int32),
        logits_indices=np.concatenate(
            [first.logits_indices, second.logits_indices + num_tokens]
        ).astype(np.int64),
        sampled_rows=np.concatenate([first.sampled_rows, second.sampled_rows + num_seqs]).astype(
            np.int64
        ),
        max_query_len=max(first.max_query_len, second.max_query_len),
        max_seq_len=max(first.max_seq_len, second.max_seq_len),
        num_decode_prefix=leading,
        adapters=adapters,
        embeds=join_embeds(first.embeds, second.embeds, num_tokens),
    )


def _adapters_or_none(inputs: StepInputs) -> np.ndarray:
    if inputs.adapters is not None:
        return inputs.adapters
    return np.full(len(inputs.seq_lens), -1, dtype=np.int32)


def streaming_inputs(states: list[RequestState], inputs: StepInputs) -> StreamingInputs | None:
    """The step's StreamingLLM arrays, None when no sequence streams: a query at position p
    meets the sinks at its cache position min(p, S + W - 1)."""
    params = [s.params for s in states]
    if not any(p.is_streaming for p in params):
        return None
    num_seqs = len(states)
    windows = np.fromiter((p.streaming_window or 0 for p in params), np.int64, num_seqs)
    sinks = np.fromiter((p.sink_tokens or 0 for p in params), np.int64, num_seqs)
    sinks[windows == 0] = 0
    owner = np.repeat(np.arange(num_seqs), np.diff(inputs.query_start_loc))
    positions = inputs.positions
    last = np.where(windows > 0, sinks + windows - 1, np.iinfo(np.int64).max)[owner]
    return StreamingInputs(
        windows=windows.astype(np.int32),
        sink_tokens=sinks.astype(np.int32),
        cache_positions=np.minimum(positions, last).astype(np.int64),
    )
