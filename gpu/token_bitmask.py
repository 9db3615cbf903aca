"""Grammar token masks in the sampler: a TokenMasks message meets a step's logits.

The grammar actor packs, per constrained row, one bit per token (xgrammar's layout: bit t % 32
of int32 word t // 32, set = allowed). The runner lays them over the step's sampled rows
(`step_bitmask`: all bits set for unconstrained rows) and the sampler sets the logits of
disallowed tokens to -inf after penalties, before greedy argmax or any filter, on the CPU and on
CUDA alike (one gather and one select over [rows, vocab]).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
from troupe.gpu.device_inputs import host_to_device
from troupe.gpu.pinned_host import is_pinned
from troupe.messages import SampledToken, TokenMasks


def mask_array(masks: TokenMasks) -> np.ndarray:
    """int32 [len(masks.request_ids), num_words], a view of the message's bytes."""
    return np.frombuffer(masks.bitmask, dtype=np.int32).reshape(-1, masks.num_words)


def row_order(masks: TokenMasks, request_ids: Sequence[str]) -> np.ndarray | None:
    """For each sampled row, its row in `masks` (-1: unconstrained); None when they are the
    masks' rows in order."""
    if tuple(request_ids) == masks.request_ids:
        return None
    index = {rid: i for i, rid in enumerate(masks.request_ids)}  # a later row wins
    return np.fromiter((index.get(rid, -1) for rid in request_ids), np.intp, len(request_ids))


def step_bitmask(masks: TokenMasks, request_ids: Sequence[str]) -> np.ndarray:
    """int32 [len(request_ids), num_words]: each sampled row's mask, all ones where the row is
    unconstrained."""
    given = mask_array(masks)
    rows = row_order(masks, request_ids)
    return given if rows is None else _lay_rows(given, rows)


def _lay_rows(given: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows of `given` that `rows` names, all ones for -1 (row_order's answer)."""
    if not len(given):
        return np.full((len(rows), given.shape[1]), -1, dtype=np.int32)
    out: np.ndarray = given[rows]  # one gather
    out[rows < 0] = -1
    return out


def join_masks(first: TokenMasks, second: TokenMasks) -> TokenMasks:
    """One TokenMasks with the rows of both (a step's fresh masks and those filled ahead)."""
    assert first.num_words == second.num_words, "masks of one vocabulary"
    return TokenMasks(
        step_id=first.step_id,
        request_ids=first.request_ids + second.request_ids,
        num_words=first.num_words,
        bitmask=b"".join((first.bitmask, second.bitmask)),  # views of the shared file too
        failed=first.failed + second.failed,
        dead_ends=first.dead_ends + second.dead_ends,
    )


class BitmaskUpload:
    """Copies step bitmasks to the device. Bits in page-locked memory (the grammar process's
    shared file, registered by gpu/pinned_host.py) go by DMA straight from there, rows laid
    out on the device; others are gathered on the host into one pinned buffer, kept and
    grown: pinning a fresh 5 MB tensor every step (256 rows of a 152k vocabulary) costs more
    than the copy. Reusing it, and reading a source after the call, is safe: the runner reads
    each step's samples back (a sync) before the next step's upload; the last source is kept
    alive (its slot of the shared file unused) until then.

    The copy into the buffer keeps the interpreter lock (a memoryview assignment): numpy's
    copy lets go of it, and the executor thread then waits for the event loop's thread to hand
    it back, up to a switch interval, on the masked step's critical path (twice the copy's own
    time beside a busy loop on this project's CPU machine)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned: torch.Tensor | None = None
        self._source: np.ndarray | None = None  # read by a DMA that may still run

    def for_rows(self, masks: TokenMasks, request_ids: Sequence[str]) -> torch.Tensor:
        """int32 [len(request_ids), num_words] on the device: step_bitmask's rows."""
        given = mask_array(masks)
        rows = row_order(masks, request_ids)
        if rows is None:
            return self(given)
        if not (self.device.type == "cuda" and len(given) and is_pinned(given)):
            return self(_lay_rows(given, rows))
        laid = self(given).index_select(0, host_to_device(np.maximum(rows, 0), self.device))
        if (rows < 0).any():
            laid.masked_fill_(host_to_device(rows < 0, self.device)[:, None], -1)
        return laid

    def __call__(self, bitmask: np.ndarray) -> torch.Tensor:
        if self.device.type != "cuda":
            return torch.from_numpy(np.array(bitmask, dtype=np.int32))  # its own, writable
        if bitmask.dtype == np.int32 and bitmask.flags.c_contiguous and is_pinned(bitmask):
            self._source = bitmask
            return torch.from_numpy(bitmask).to(self.device, non_blocking=True)
        rows, words = bitmask.shape
        pinned = self._pinned
        if pinned is None or pinned.shape[0] < rows or pinned.shape[1] != words:
            pinned = torch.empty((max(rows, 64), words), dtype=torch.int32).pin_memory()
            self._pinned = pinned
        target = pinned[:rows].numpy().data.cast("B")
        target[:] = np.ascontiguousarray(bitmask, dtype=np.int32).data.cast("B")
        return pinned[:rows].to(self.device, non_blocking=True)


def to_device(bitmask: np.ndarray, device: torch.device) -> torch.Tensor:
    """One upload without a kept buffer (tests)."""
    return BitmaskUpload(device)(bitmask)


@functools.lru_cache(maxsize=4)
def _bit_index(vocab_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(vocab_size, device=device)
    return ids >> 5, (ids & 31).to(torch.int32)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """`logits` [S, V] with -inf where `bitmask` [S, >= V/32] (int32) clears the token's bit."""
    word, bit = _bit_index(logits.shape[-1], logits.device)
    allowed = (bitmask.index_select(1, word) >> bit) & 1
    return logits.masked_fill(allowed == 0, float("-inf"))


def allowed_ids(bitmask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids whose bit is set in one row (int32 words), ascending."""
    bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])


def constrain_sampled(
    sampled: Sequence[SampledToken], masks: TokenMasks, vocab_size: int
) -> tuple[SampledToken, ...]:
    """For runners without logits (the fake): a disallowed token becomes an allowed one, picked
    by the token itself (deterministic), so the text still follows the grammar."""
    given = mask_array(masks)
    index = {rid: i for i, rid in enumerate(masks.request_ids)}
    out = []
    for s in sampled:
        row = index.get(s.request_id)
        if row is not None:
            allowed = allowed_ids(given[row], vocab_size)
            if len(allowed) and s.token_id not in allowed:
                s = SampledToken(s.request_id, int(allowed[s.token_id % len(allowed)]), None)
        out.append(s)
    return tuple(out)
