"""Step inputs onto the device: host arrays copied without stalling the stream, and the
attention metadata of one step."""

from __future__ import annotations

import numpy as np
import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.step_inputs import StepInputs


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """An async copy on CUDA: a pageable source would make the copy wait for the stream."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        tensor = tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def device_metadata(inputs: StepInputs, device: torch.device) -> AttentionMetadata:
    """The step's attention metadata on `device` (positions and ids travel separately)."""

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
    )
