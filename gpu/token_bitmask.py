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
from troupe.messages import SampledToken, TokenMasks


def mask_array(masks: TokenMasks) -> np.ndarray:
    """int32 [len(masks.request_ids), num_words], a view of the message's bytes."""
    return np.frombuffer(masks.bitmask, dtype=np.int32).reshape(-1, masks.num_words)


def step_bitmask(masks: TokenMasks, request_ids: Sequence[str]) -> np.ndarray:
    """int32 [len(request_ids), num_words]: each sampled row's mask, all ones where the row is
    unconstrained."""
    given = mask_array(masks)
    if tuple(request_ids) == masks.request_ids:
        return given
    index = {rid: i for i, rid in enumerate(masks.request_ids)}
    out = np.full((len(request_ids), masks.num_words), -1, dtype=np.int32)
    for row, rid in enumerate(request_ids):
        found = index.get(rid)
        if found is not None:
            out[row] = given[found]
    return out


def to_device(bitmask: np.ndarray, device: torch.device) -> torch.Tensor:
    if not bitmask.flags.writeable:  # a view of the message's bytes: torch wants its own
        bitmask = bitmask.copy()
    tensor = torch.from_numpy(np.ascontiguousarray(bitmask))
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


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
