"""Gemma 2's and Gemma 3's decoder layer: sandwich norms around attention and a GeGLU MLP.

    h = h + post_attention_norm(attention(input_norm(h)))
    h = h + post_feedforward_norm(mlp(pre_feedforward_norm(h)))

The residual stream is carried as in DecoderLayer: each layer returns (mlp output after its
post norm, residual) and the next layer's fused add + norm folds them. Norm weights hold
(1 + weight) (gpu/weight_fill.py adds the 1), so the shared rms_norm op serves; in fp32
that is HF's arithmetic exactly, in bf16 HF multiplies in fp32 before the cast (a last-bit
difference).
"""

from __future__ import annotations

import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, KVCache, new_param
from troupe.kernels.ops import KernelOps


class Gemma3Layer(DecoderLayer):
    """DecoderLayer plus the pre/post feed-forward norms; q/k norm (Gemma 3), the window and
    the attention scores' cap (Gemma 2) come from the config (ModelConfig.qk_norm,
    layer_windows, attn_logit_softcapping)."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        size = config.hidden_size
        self.pre_feedforward_layernorm = new_param(size, dtype=dtype, device=device)
        self.post_feedforward_layernorm = new_param(size, dtype=dtype, device=device)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        cos_sin: torch.Tensor,
        ops: KernelOps,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        eps = self.config.rms_norm_eps
        x, residual = ops.rms_norm(hidden, self.input_layernorm, eps, residual)
        attn = self.attention(x, positions, meta, kv_cache, cos_sin, ops)
        attn = ops.rms_norm(attn, self.post_attention_layernorm, eps)[0]
        x, residual = ops.rms_norm(attn, self.pre_feedforward_layernorm, eps, residual)
        out = ops.rms_norm(self.mlp(x, ops), self.post_feedforward_layernorm, eps)[0]
        return out, residual
