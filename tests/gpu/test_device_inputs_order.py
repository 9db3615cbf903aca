"""A step's attention metadata names its one-token decodes longest first (the decode kernel's
launch order, kernels/decode_order.py); a step without decodes names none."""

from __future__ import annotations

import numpy as np
import torch
from troupe.gpu.device_inputs import device_metadata
from troupe.gpu.step_inputs import StepInputs


def _inputs(seq_lens: list[int], query_lens: list[int], decodes: int = 0) -> StepInputs:
    n, total = len(seq_lens), sum(query_lens)
    starts = np.concatenate(([0], np.cumsum(query_lens))).astype(np.int32)
    return StepInputs(
        input_ids=np.zeros(total, np.int64),
        positions=np.zeros(total, np.int64),
        slot_mapping=np.arange(total, dtype=np.int64),
        block_tables=np.zeros((n, 4), np.int32),
        seq_lens=np.array(seq_lens, np.int32),
        query_start_loc=starts,
        logits_indices=(starts[1:] - 1).astype(np.int64),
        sampled_rows=np.arange(n, dtype=np.int64),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        num_decode_prefix=decodes,
    )


def test_decode_metadata_orders_longest_first() -> None:
    meta = device_metadata(_inputs([5, 40, 12, 40], [1, 1, 1, 1]), torch.device("cpu"))
    assert meta.decode_order is not None
    assert meta.decode_order.dtype == torch.int32 and meta.decode_order.tolist() == [1, 3, 2, 0]


def test_mixed_metadata_orders_its_leading_decodes() -> None:
    meta = device_metadata(_inputs([5, 40, 12, 90], [1, 1, 1, 8], decodes=3), torch.device("cpu"))
    assert meta.decode_order is not None and meta.decode_order.tolist() == [1, 2, 0, 3]


def test_prefill_metadata_has_no_order() -> None:
    meta = device_metadata(_inputs([5, 40], [3, 8]), torch.device("cpu"))
    assert meta.decode_order is None
