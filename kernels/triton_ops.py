"""The Triton implementation of every model op (kernels.ops.KernelOps), under the op's name.

Each kernel lives in its own module with its tuning knobs (`out=`, `num_splits=`); the model
calls them through these names only. On the CPU they run under Triton's interpreter
(TRITON_INTERPRET=1, Triton's own switch, set before Triton is imported): the kernel tests do.
"""

from __future__ import annotations

import torch

from . import reference
from .decode_attention import paged_decode_attention_triton as paged_decode_attention
from .extend_attention import extend_attention_triton
from .fused_moe import fused_moe_triton as fused_moe
from .kv_scales import update_kv_scales_triton as update_kv_scales
from .kv_write import write_kv_triton as write_kv
from .mla_ops import mla_attention, write_latent
from .mla_prefill import mla_prefill
from .paged_attention import paged_attention_triton
from .qkv_prepare import prepare_qkv_triton as prepare_qkv
from .rms_norm import rms_norm_triton as rms_norm
from .rotary import rotary_triton as rotary
from .silu_mul import gelu_tanh_mul_triton as gelu_tanh_mul
from .silu_mul import silu_mul_triton as silu_mul

reads_new_kv = True  # KernelOps: paged_attention takes the new keys from new_kv (extend kernel)

__all__ = [
    "fused_moe",
    "gelu_tanh_mul",
    "mla_attention",
    "mla_prefill",
    "paged_attention",
    "paged_decode_attention",
    "prepare_qkv",
    "reads_new_kv",
    "rms_norm",
    "rotary",
    "silu_mul",
    "update_kv_scales",
    "write_kv",
    "write_latent",
]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    decode_prefix: torch.Tensor | None = None,
    *,
    sliding_window: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    seq_order: torch.Tensor | None = None,
    new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    key_limits: torch.Tensor | None = None,
) -> torch.Tensor:
    """The new keys from new_kv where given (kernels/extend_attention.py), else all paged.
    Key limits (image rows that see their whole image) are not in the kernels yet: such a
    step takes the torch reference (eager, as such steps are: gpu/forward_pass.py)."""
    if key_limits is not None:
        return reference.paged_attention(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, max_query_len,
            max_seq_len, decode_prefix, sliding_window=sliding_window, k_scale=k_scale,
            v_scale=v_scale, softcap=softcap, sinks=sinks, key_limits=key_limits,
        )  # fmt: skip
    if new_kv is not None:
        return extend_attention_triton(
            q, k_cache, v_cache, new_kv, block_tables, seq_lens, query_start_loc, scale,
            max_seq_len, decode_prefix, sliding_window=sliding_window, k_scale=k_scale,
            v_scale=v_scale, seq_order=seq_order, softcap=softcap, sinks=sinks,
        )  # fmt: skip
    return paged_attention_triton(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, max_query_len,
        max_seq_len, decode_prefix, sliding_window=sliding_window, k_scale=k_scale,
        v_scale=v_scale, seq_order=seq_order, softcap=softcap, sinks=sinks,
    )  # fmt: skip
