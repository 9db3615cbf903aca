"""Attention metadata of one step: what the attention ops read besides q and the caches."""

from __future__ import annotations

import dataclasses

import torch
from troupe.kernels.streaming_attention import StreamingMetadata


@dataclasses.dataclass(frozen=True)
class ExpandedPrefill:
    """An eager step whose prefill chunks MLA attends to in the expanded form (gpu/mla_layer.py):
    the sequences before first_prefill are one-token decodes (the absorbed form); the others
    (the longest max_seq_len tokens) expand the latent of exactly their cache blocks, `blocks`,
    to per-head K/V, and `tables` row s lists sequence first_prefill + s's blocks as indices
    into `blocks` (padding entries 0, never read). Built on the host once per step
    (gpu/device_inputs.py)."""

    first_prefill: int
    max_seq_len: int
    blocks: torch.Tensor  # [NB] int64 on the device: cache block ids
    tables: torch.Tensor  # [S - first_prefill, W] int32 on the device: indices into blocks


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
    # int32 [1] on the device: the first N sequences are one-token decodes (a kernel hint)
    decode_prefix: torch.Tensor | None = None
    # int32 [S] on the device: the one-token decodes (all sequences of a decode step, the
    # decode_prefix of a mixed one) longest first, then the rest, the order in which the
    # decode kernel starts them (a hint: kernels/decode_order.py); None: batch order
    decode_order: torch.Tensor | None = None
    # MLA models: set when the step's longest prefill chunk is long enough to expand
    # (gpu/forward_pass.py decides); None: every row takes the absorbed form
    expanded_prefill: ExpandedPrefill | None = None
    # StreamingLLM sequences in the step (kernels/streaming_attention.py); None: none
    streaming: StreamingMetadata | None = None
    # int32 [T] on the device: each row's last visible key position where image rows attend
    # to their whole image (gpu/embed_rows.key_limits); None: causal
    key_limits: torch.Tensor | None = None
