"""Step inputs onto the device: host arrays copied without stalling the stream, and the
attention metadata of one step."""

from __future__ import annotations

import numpy as np
import torch
from troupe.gpu.attention import AttentionMetadata, ExpandedPrefill
from troupe.gpu.step_inputs import StepInputs


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """An async copy on CUDA: a pageable source would make the copy wait for the stream."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        tensor = tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def expanded_prefill(inputs: StepInputs, min_tokens: int) -> ExpandedPrefill | None:
    """The split of a step whose longest prefill chunk has at least min_tokens tokens (an MLA
    model then expands its prefill sequences, gpu/mla_layer.py); None otherwise or when 0."""
    if min_tokens <= 0 or inputs.is_decode or inputs.max_query_len < min_tokens:
        return None
    first = inputs.num_decode_prefix
    return ExpandedPrefill(first_prefill=first, max_seq_len=int(inputs.seq_lens[first:].max()))


def device_metadata(
    inputs: StepInputs, device: torch.device, expand_min_tokens: int = 0
) -> AttentionMetadata:
    """The step's attention metadata on `device` (positions and ids travel separately);
    expand_min_tokens > 0: see expanded_prefill."""

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
        expanded_prefill=expanded_prefill(inputs, expand_min_tokens),
    )
