"""A step's inputs as the LoRA runtime reads them (gpu/lora_runtime.py: the per-sequence
adapter ids and query lengths), for the LoRA layer tests; every other field a placeholder."""

from __future__ import annotations

import numpy as np
from troupe.gpu.step_inputs import StepInputs


def lora_step_inputs(adapters: list[int], lens: list[int]) -> StepInputs:
    """One sequence per entry: adapter id (-1: none) and query length."""
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    total, n = int(qsl[-1]), len(lens)
    return StepInputs(
        input_ids=np.zeros(total, np.int64),
        positions=np.zeros(total, np.int64),
        slot_mapping=np.zeros(total, np.int64),
        block_tables=np.zeros((n, 1), np.int32),
        seq_lens=np.asarray(lens, np.int32),
        query_start_loc=qsl,
        logits_indices=qsl[1:] - 1,
        sampled_rows=np.arange(n),
        max_query_len=max(lens),
        max_seq_len=max(lens),
        adapters=np.asarray(adapters, np.int32),
    )
