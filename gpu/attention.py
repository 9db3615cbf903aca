"""Attention metadata of one step, and the choice of op implementations per device."""

from __future__ import annotations

import dataclasses
import os
from types import ModuleType

import torch


@dataclasses.dataclass(kw_only=True)
class AttentionMetadata:
    """Where each token's KV goes and what each sequence attends to, for one forward.

    Tokens are flat: sequence s owns rows query_start_loc[s]:query_start_loc[s+1]. seq_lens
    count the tokens already in the cache plus this step's. For a pure decode step every
    sequence has one token and the decode kernel is used.
    """

    slot_mapping: torch.Tensor  # [T] int64; < 0: padding, not written
    block_tables: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32
    query_start_loc: torch.Tensor  # [S + 1] int32
    max_query_len: int
    max_seq_len: int
    is_decode: bool
    logits_indices: torch.Tensor  # [N] int64: rows whose hidden state reaches lm_head


def select_ops(device: torch.device) -> ModuleType:
    """The Triton dispatch module on CUDA (when present), the torch path on the CPU.

    The CPU runs the torch path even though Triton's interpreter could run the kernels: the
    interpreter is orders of magnitude slower, and the kernels have their own tests.
    TROUPE_FORCE_TRITON=1 (read by kernels.ops) runs the kernels on the CPU too.
    """
    if device.type == "cuda" or os.environ.get("TROUPE_FORCE_TRITON", "0") == "1":
        try:
            from troupe.kernels import ops

            return ops
        except ImportError:  # kernels not written yet: stay correct, if slower
            pass
    from troupe.gpu import torch_ops

    return torch_ops
