"""GLM-4's decoder layer (transformers' Glm4DecoderLayer, GLM-4-0414): sandwich norms, the
MLP's input norm keeping Llama's name.

    h = h + post_self_attn_layernorm(attention(input_layernorm(h)))
    h = h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))

Its rotary is partial and interleaved (ModelConfig.rotary_dim, rope_interleaved): the loader
reorders q/k for the kernels (gpu/rope_layers.py). The residual stream is carried as in
DecoderLayer: each layer returns (MLP output after its post norm, residual) and the next
layer's fused add + norm folds them.
"""

from __future__ import annotations

import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, KVCache, new_param
from troupe.kernels.ops import KernelOps


class Glm4Layer(DecoderLayer):
    """DecoderLayer plus the norms after attention and after the MLP."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        size = config.hidden_size
        self.post_self_attn_layernorm = new_param(size, dtype=dtype, device=device)
        self.post_mlp_layernorm = new_param(size, dtype=dtype, device=device)

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
        attn = ops.rms_norm(attn, self.post_self_attn_layernorm, eps)[0]
        x, residual = ops.rms_norm(attn, self.post_attention_layernorm, eps, residual)
        out = ops.rms_norm(self.mlp(x, ops), self.post_mlp_layernorm, eps)[0]
        return out, residual

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The two norms Llama's layer has not."""
        for name in ("post_self_attn_layernorm", "post_mlp_layernorm"):
            if rest == f"{name}.weight":
                return getattr(self, name), (f"{prefix}.{name}",)
        return None
