"""Step inputs onto the device: host arrays copied without stalling the stream, and the
attention metadata of one step."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from troupe.gpu.attention import AttentionMetadata, ExpandedPrefill
from troupe.gpu.embed_rows import key_limits
from troupe.gpu.step_inputs import StepInputs
from troupe.kernels.decode_order import longest_first
from troupe.kernels.streaming_attention import StreamingMetadata


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """An async copy on CUDA: a pageable source would make the copy wait for the stream."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        tensor = tensor.pin_memory().to(device, non_blocking=True)
    return tensor


@dataclasses.dataclass(frozen=True)
class ExpandPolicy:
    """When an MLA model expands a step's prefills (gpu/mla_layer.py): the longest chunk has at
    least min_tokens tokens (0: never) and the prefill sequences' blocks hold at most
    max_tokens tokens, which bounds the expansion's transient memory (per-head K/V of every
    cached token of those sequences, one layer at a time)."""

    min_tokens: int = 0
    max_tokens: int = 0

    def applies(self, inputs: StepInputs, block_size: int) -> bool:
        if self.min_tokens <= 0 or inputs.is_decode or inputs.max_query_len < self.min_tokens:
            return False
        blocks = -(-inputs.seq_lens[inputs.num_decode_prefix :].astype(np.int64) // block_size)
        return int(blocks.sum()) * block_size <= self.max_tokens


NEVER = ExpandPolicy()


def expanded_prefill(
    inputs: StepInputs, policy: ExpandPolicy, block_size: int, device: torch.device
) -> ExpandedPrefill | None:
    """The split of a step the policy expands, None for others: the prefill sequences' blocks
    and their tables into them, on `device`."""
    if not policy.applies(inputs, block_size):
        return None
    first = inputs.num_decode_prefix
    lens = inputs.seq_lens[first:].astype(np.int64)
    counts = -(-lens // block_size)
    width = int(counts.max())
    cols = np.arange(width)
    used = cols[None, :] < counts[:, None]
    starts = np.cumsum(counts) - counts
    tables = np.where(used, starts[:, None] + cols[None, :], 0).astype(np.int32)
    blocks = inputs.block_tables[first:, :width][used].astype(np.int64)  # row-major: in order
    return ExpandedPrefill(
        first_prefill=first,
        max_seq_len=int(lens.max()),
        blocks=host_to_device(blocks, device),
        tables=host_to_device(tables, device),
    )


def device_metadata(
    inputs: StepInputs,
    device: torch.device,
    expand: ExpandPolicy = NEVER,
    block_size: int = 1,
    whole_images: bool = False,
) -> AttentionMetadata:
    """The step's attention metadata on `device` (positions and ids travel separately); with
    an expand policy (and the cache's block_size) see expanded_prefill. `whole_images`: the
    model's image rows attend to their whole image (AttentionMetadata.key_limits)."""
    limits = key_limits(inputs.embeds, inputs.positions) if whole_images else None

    def put(array: np.ndarray) -> torch.Tensor:
        return host_to_device(array, device)

    return AttentionMetadata(
        slot_mapping=put(inputs.slot_mapping),
        block_tables=put(inputs.block_tables),
        seq_lens=put(inputs.seq_lens),
        query_start_loc=put(inputs.query_start_loc),
        max_query_len=inputs.max_query_len,
        max_seq_len=inputs.max_seq_len,
        is_decode=inputs.is_decode,
        logits_indices=put(inputs.logits_indices),
        decode_prefix=(
            put(np.array([inputs.num_decode_prefix], dtype=np.int32))
            if inputs.num_decode_prefix and not inputs.is_decode
            else None
        ),
        decode_order=(
            put(
                longest_first(
                    inputs.seq_lens, None if inputs.is_decode else inputs.num_decode_prefix
                )
            )
            if inputs.is_decode or inputs.num_decode_prefix
            else None
        ),
        expanded_prefill=expanded_prefill(inputs, expand, block_size, device),
        streaming=(
            None
            if inputs.streaming is None
            else StreamingMetadata(
                put(inputs.streaming.windows),
                put(inputs.streaming.sink_tokens),
                put(inputs.streaming.cache_positions),
            )
        ),
        key_limits=None if limits is None else put(limits),
    )
