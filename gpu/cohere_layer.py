"""Cohere's decoder layer (transformers' CohereDecoderLayer and Cohere2DecoderLayer: Command R,
R+, R7B, A, Aya): one LayerNorm, then attention and the MLP side by side on its output,

    h = h + attention(norm(h)) + mlp(norm(h))

with no norm between them (the checkpoint has no post_attention_layernorm). The stream comes
in as the previous layer's (hidden, residual), whose sum it is, and goes out the same way:
(attention + MLP, the stream), so the next layer's norm, or the model's final one, adds them.
The norms are LayerNorms without bias (gpu/layer_norm.py). Command R+'s q and k are
LayerNorm'd per head, each head with weights of its own (use_qk_norm; the checkpoint's
self_attn.q_norm / k_norm, [heads, head_dim]), before RoPE, which rotates interleaved pairs
(the loader reorders q / k and these weights alike: gpu/rope_layers.py). Cohere 2's global
layers do not rotate (ModelConfig.nope_layers); the logits are times logit_scale
(ModelConfig.final_logits).
"""

from __future__ import annotations

import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.layer_norm import head_layer_norm, layer_norm
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, KVCache, new_param
from troupe.kernels.ops import KernelOps


class CohereLayer(DecoderLayer):
    """The parallel block above, with per-head q / k LayerNorms where the config has them."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        c = config
        # no norm before the MLP; the q / k norms are LayerNorms with weights per head
        for name in ("post_attention_layernorm", "q_norm", "k_norm"):
            delattr(self, name)  # a parameter, or None where the config has no q / k norm
            setattr(self, name, None)
        self.q_heads_norm = new_param(c.q_size, dtype=dtype, device=device) if c.qk_norm else None
        self.k_heads_norm = new_param(c.kv_size, dtype=dtype, device=device) if c.qk_norm else None

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
        x, stream = layer_norm(hidden, self.input_layernorm, self.config.rms_norm_eps, residual)
        out = self.attention(x, positions, meta, kv_cache, cos_sin, ops) + self.mlp(x, ops)
        return out, stream

    def project_qkv(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        qkv = super().project_qkv(x, ops)
        if self.q_heads_norm is None or self.k_heads_norm is None:
            return qkv
        c = self.config
        q_end, k_end = c.q_size, c.q_size + c.kv_size
        q = head_layer_norm(qkv[:, :q_end], self.q_heads_norm, c.head_dim, c.rms_norm_eps)
        k = head_layer_norm(qkv[:, q_end:k_end], self.k_heads_norm, c.head_dim, c.rms_norm_eps)
        return torch.cat([q, k, qkv[:, k_end:]], dim=-1)

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The per-head q / k norms ([heads, head_dim] in the checkpoint, flat here)."""
        c = self.config
        if self.q_heads_norm is not None and rest == "self_attn.q_norm.weight":
            return self.q_heads_norm.view(c.num_heads, c.head_dim), (f"{prefix}.q_heads_norm",)
        if self.k_heads_norm is not None and rest == "self_attn.k_norm.weight":
            kv_heads = self.k_heads_norm.view(c.num_kv_heads, c.head_dim)
            return kv_heads, (f"{prefix}.k_heads_norm",)
        return super().locate_extra(rest, prefix)
