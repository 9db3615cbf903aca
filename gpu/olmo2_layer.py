"""OLMo 2's decoder layer (transformers' Olmo2DecoderLayer): norms after attention and after
the MLP, none before, and q / k RMS-normalised across all heads at once (weights [q_size] and
[kv_size]: the checkpoint's self_attn.q_norm / k_norm), before RoPE.

    stream -> attention(stream) -> post_attention_layernorm -> + stream
           -> mlp(...)          -> post_feedforward_layernorm -> + stream

The stream comes in as the previous layer's (hidden, residual), whose sum it is (the fused
norm-add of the other layers defers that add); the model's final norm adds the last pair.

EXAONE 4's layer is the same but for its q / k norms, which are per head (ModelConfig.qk_norm:
the fused q/k/v kernel's, as Qwen3's), and its windowed layers beside NoPE global ones
(gpu/rope_layers.py).

OLMoE's layer is the pre-norm MoE layer (gpu/moe_layer.py) with OLMo's whole-width q / k norms,
and q, k and v clamped to +-clip_qkv after them where the config sets it (transformers'
OlmoeAttention).
"""

from __future__ import annotations

import torch
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, KVCache, new_param
from troupe.gpu.moe_layer import MoeLayer
from troupe.kernels.ops import KernelOps


class WholeWidthQkNorm(DecoderLayer):
    """q / k RMS-normalised across all heads (weights [q_size] and [kv_size], the checkpoint's
    self_attn.q_norm / k_norm) where the config's q/k norm is not per head (qk_norm), then
    q, k and v clamped to +-clip_qkv where set; subclasses put it before their own layer."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        self.whole_width = not config.qk_norm
        if self.whole_width:
            self.q_norm_all = new_param(config.q_size, dtype=dtype, device=device)
            self.k_norm_all = new_param(config.kv_size, dtype=dtype, device=device)

    def project_qkv(self, x: torch.Tensor, ops: KernelOps) -> torch.Tensor:
        qkv = super().project_qkv(x, ops)
        c, eps = self.config, self.config.rms_norm_eps
        if self.whole_width:
            q_end, k_end = c.q_size, c.q_size + c.kv_size
            q = ops.rms_norm(qkv[:, :q_end].contiguous(), self.q_norm_all, eps)[0]
            k = ops.rms_norm(qkv[:, q_end:k_end].contiguous(), self.k_norm_all, eps)[0]
            qkv = torch.cat([q, k, qkv[:, k_end:]], dim=-1)
        if c.clip_qkv is not None:
            qkv = qkv.clamp(-c.clip_qkv, c.clip_qkv)
        return qkv

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The whole-width q / k norms (the plain layer's q_norm / k_norm are per head)."""
        if self.whole_width and rest == "self_attn.q_norm.weight":
            return self.q_norm_all, (f"{prefix}.q_norm_all",)
        if self.whole_width and rest == "self_attn.k_norm.weight":
            return self.k_norm_all, (f"{prefix}.k_norm_all",)
        return super().locate_extra(rest, prefix)


class Olmo2Layer(WholeWidthQkNorm):
    """Post-norm layer with whole-width (OLMo) or per-head (EXAONE 4) q / k norms."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        del self.input_layernorm  # OLMo 2 normalises after, not before
        self.post_feedforward_layernorm = new_param(config.hidden_size, dtype=dtype, device=device)

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
        stream = hidden if residual is None else hidden + residual
        attn = self.attention(stream, positions, meta, kv_cache, cos_sin, ops)
        stream = stream + ops.rms_norm(attn, self.post_attention_layernorm, eps)[0]
        out = ops.rms_norm(self.mlp(stream, ops), self.post_feedforward_layernorm, eps)[0]
        return out, stream


class OlmoeLayer(WholeWidthQkNorm, MoeLayer):
    """OLMoE: MoeLayer's pre-norm layer and experts under the whole-width q / k norms."""
