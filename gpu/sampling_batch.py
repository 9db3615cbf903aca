"""Build a SamplingBatch from the sampled requests' params and token histories.

Per step this is one np.stack of the requests' precomputed param rows, the row keys hashed in
numpy, and two host->device copies (floats, keys). Penalty tensors are built only for batches
that use penalties, and the filter flags let the sampler skip top-k/top-p/min-p entirely.

`SamplingBatches` keeps the last batch built: a step that samples the same requests with the
same params (a run of decode steps) reuses its uploaded settings and hashes only the new keys;
one that samples some of them, in any order (requests ended), gathers their settings on the
device by one index instead of stacking and uploading the rows again.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from troupe.config import LogprobsMode
from troupe.gpu import request_states as cols
from troupe.gpu.device_inputs import host_to_device
from troupe.gpu.logit_edits import build_logit_edits
from troupe.gpu.request_states import RequestState
from troupe.gpu.sampler import SamplingBatch, row_keys_array


def build_sampling_batch(
    states: list[RequestState],
    vocab_size: int,
    device: torch.device,
    offsets: np.ndarray | None = None,
    logprobs_mode: LogprobsMode = "raw_logprobs",
) -> SamplingBatch:
    """One row per sampled request. The sampled token's position is the request's num_tokens,
    plus the row's offset when given (verifying proposals: a request has a row per proposal,
    its history read up to that position, proposals included)."""
    return _build(states, vocab_size, device, offsets, logprobs_mode)[0]


def _build(
    states: list[RequestState],
    vocab_size: int,
    device: torch.device,
    offsets: np.ndarray | None = None,
    logprobs_mode: LogprobsMode = "raw_logprobs",
) -> tuple[SamplingBatch, np.ndarray, torch.Tensor]:
    """build_sampling_batch's batch, its param rows (top-k clamped) and their device copy."""
    num_rows = len(states)
    table = np.stack([s.param_row for s in states]) if states else np.zeros((0, 8))
    top_k = table[:, cols.TOP_K]
    top_k = np.where((top_k > 0) & (top_k < vocab_size), top_k, vocab_size)
    table[:, cols.TOP_K] = top_k
    seeds = np.fromiter((s.seed for s in states), np.uint64, num_rows)
    known = np.fromiter((s.num_tokens for s in states), np.int64, num_rows)
    ends = known if offsets is None else known + offsets
    keys = _upload_keys(seeds, ends, device)
    floats = host_to_device(table.astype(np.float32), device)
    batch = _settings(table, floats, keys, vocab_size, logprobs_mode)
    edits = [s.edits for s in states]
    if any(e is not None for e in edits):
        num_prompt = np.fromiter((s.num_prompt_tokens for s in states), np.int64, num_rows)
        histories = [s.tokens for s in states]
        settled = known - num_prompt  # proposals after them may yet be rejected
        batch.logit_edits = build_logit_edits(
            edits, ends - num_prompt, device, histories, ends, settled
        )
    uses_output = (table[:, cols.PRESENCE] != 0.0) | (table[:, cols.FREQUENCY] != 0.0)
    uses_seen = table[:, cols.REPETITION] != 1.0
    if uses_output.any():
        batch.output_counts = _counts(states, ends, uses_output, vocab_size, device, prompt=False)
    if uses_seen.any():
        seen = _counts(states, ends, uses_seen, vocab_size, device, prompt=True) > 0
        batch.seen_mask = seen
    return batch, table, floats


def _settings(
    table: np.ndarray,
    floats: torch.Tensor,
    keys: torch.Tensor,
    vocab_size: int,
    logprobs_mode: LogprobsMode,
) -> SamplingBatch:
    """The batch of the param rows `table` (top-k already clamped to the vocabulary), `floats`
    its device copy (fp32), with the row keys; no edits, penalties or masks."""
    random_rows = table[:, cols.TEMPERATURE] > 0.0
    logprobs = table[:, cols.LOGPROBS].astype(np.int64).tolist()
    return SamplingBatch(
        temperature=floats[:, cols.TEMPERATURE],
        top_k=floats[:, cols.TOP_K].long(),
        top_p=floats[:, cols.TOP_P],
        min_p=floats[:, cols.MIN_P],
        keys=keys,
        presence=floats[:, cols.PRESENCE],
        frequency=floats[:, cols.FREQUENCY],
        repetition=floats[:, cols.REPETITION],
        num_logprobs=tuple(None if n < 0 else n for n in logprobs),
        logprobs_mode=logprobs_mode,
        all_greedy=not random_rows.any(),
        use_top_k=bool((random_rows & (table[:, cols.TOP_K] < vocab_size)).any()),
        use_top_p=bool((random_rows & (table[:, cols.TOP_P] < 1.0)).any()),
        use_min_p=bool((random_rows & (table[:, cols.MIN_P] > 0.0)).any()),
    )


def _upload_keys(seeds: np.ndarray, ends: np.ndarray, device: torch.device) -> torch.Tensor:
    """[S, 2] int64 row keys on `device` (through pinned memory on CUDA)."""
    keys = torch.from_numpy(row_keys_array(seeds, ends.astype(np.uint64)))
    if device.type == "cuda":
        keys = keys.pin_memory()
    return keys.to(device, non_blocking=True)


class SamplingBatches:
    """build_sampling_batch with a memory of the last batch it built: when a step samples some
    of its request states (all, or fewer, in any order), each with the params it had then, and
    none reads its position or history (logit edits, penalties), the settings uploaded then
    are reused (gathered on the device by one index for fewer rows or another order) and only
    the row keys (seed, position) are hashed and uploaded again. Its batches carry the
    engine's `logprobs_mode`."""

    def __init__(
        self, vocab_size: int, device: torch.device, logprobs_mode: LogprobsMode = "raw_logprobs"
    ) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self.num_reused = 0  # batches made from the last one's settings
        self._last: SamplingBatch | None = None
        self._rows: list[RequestState] = []  # the last batch's states (alive: ids stay theirs)
        self._params: list[np.ndarray] = []  # ... and their param rows, by identity
        self._index: dict[int, int] = {}  # id(state) -> its row
        self._table = np.zeros((0, 8))  # the param rows, top-k clamped
        self._floats = torch.zeros(0)  # ... on the device
        self._seeds = np.zeros(0, np.uint64)

    def build(self, states: list[RequestState]) -> SamplingBatch:
        last = self._last
        rows = None if last is None else self._rows_of(states)
        if last is None or rows is None:
            return self._build(states)
        self.num_reused += 1
        ends = np.fromiter((s.num_tokens for s in states), np.int64, len(states))
        keys = _upload_keys(self._seeds[rows], ends, self.device)
        if len(rows) == len(self._rows) and (rows == np.arange(len(rows))).all():
            return dataclasses.replace(last, keys=keys)
        floats = self._floats.index_select(0, host_to_device(rows, self.device))
        return _settings(self._table[rows], floats, keys, self.vocab_size, self.logprobs_mode)

    def build_rows(self, states: list[RequestState], offsets: np.ndarray) -> SamplingBatch:
        """build_sampling_batch with row `offsets` (a verification of proposals), not kept."""
        return build_sampling_batch(
            states, self.vocab_size, self.device, offsets, self.logprobs_mode
        )

    def _rows_of(self, states: list[RequestState]) -> np.ndarray | None:
        """Each state's row in the last batch, or None if one is not there with its params."""
        rows = np.empty(len(states), np.int64)
        for i, s in enumerate(states):
            row = self._index.get(id(s), -1)
            if row < 0 or self._rows[row] is not s or self._params[row] is not s.param_row:
                return None
            rows[i] = row
        return rows

    def _build(self, states: list[RequestState]) -> SamplingBatch:
        built = _build(states, self.vocab_size, self.device, logprobs_mode=self.logprobs_mode)
        batch, self._table, self._floats = built
        # bad words depend on the output, not only on its count: none of their rows is reused
        dynamic = batch.edits_logits or any(s.edits and s.edits.reads_history for s in states)
        self._last = None if dynamic else dataclasses.replace(batch)  # callers add masks
        self._rows, self._params = list(states), [s.param_row for s in states]
        self._index = {id(s): row for row, s in enumerate(states)}
        self._seeds = np.fromiter((s.seed for s in states), np.uint64, len(states))
        return batch


def _counts(
    states: list[RequestState],
    ends: np.ndarray,
    rows: np.ndarray,
    vocab_size: int,
    device: torch.device,
    *,
    prompt: bool,
) -> torch.Tensor:
    """[S, V] token counts per row, its history up to `ends`: output tokens (or prompt +
    output when `prompt`)."""
    pieces = []
    owners = []
    for row in np.flatnonzero(rows).tolist():
        state = states[row]
        assert state.tokens is not None, "a request with penalties keeps its token history"
        end = int(ends[row])
        first = 0 if prompt else min(state.num_prompt_tokens, end)
        piece = state.tokens[first:end]
        pieces.append(piece)
        owners.append(np.full(len(piece), row, dtype=np.int64))
    counts = torch.zeros(len(states), vocab_size, dtype=torch.float32, device=device)
    if pieces:
        tokens = torch.from_numpy(np.concatenate(pieces)).to(device)
        owner = torch.from_numpy(np.concatenate(owners)).to(device)
        counts.index_put_(
            (owner, tokens), torch.ones_like(tokens, dtype=torch.float32), accumulate=True
        )
    return counts
