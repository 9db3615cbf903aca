"""The Triton implementation of every model op (kernels.ops.KernelOps), under the op's name.

Each kernel lives in its own module with its tuning knobs (`out=`, `num_splits=`); the model
calls them through these names only. On the CPU they run under Triton's interpreter
(TRITON_INTERPRET=1, Triton's own switch, set before Triton is imported): the kernel tests do.
"""

from __future__ import annotations

from .decode_attention import paged_decode_attention_triton as paged_decode_attention
from .fused_moe import fused_moe_triton as fused_moe
from .kv_write import write_kv_triton as write_kv
from .mla_ops import mla_attention, write_latent
from .mla_prefill import mla_prefill
from .paged_attention import paged_attention_triton as paged_attention
from .qkv_prepare import prepare_qkv_triton as prepare_qkv
from .rms_norm import rms_norm_triton as rms_norm
from .rotary import rotary_triton as rotary
from .silu_mul import gelu_tanh_mul_triton as gelu_tanh_mul
from .silu_mul import silu_mul_triton as silu_mul

__all__ = [
    "fused_moe",
    "gelu_tanh_mul",
    "mla_attention",
    "mla_prefill",
    "paged_attention",
    "paged_decode_attention",
    "prepare_qkv",
    "rms_norm",
    "rotary",
    "silu_mul",
    "write_kv",
    "write_latent",
]
