"""What an EAGLE-1 head (gpu/eagle_model.py) and an EAGLE-3 head (gpu/eagle3_model.py) share:
the target's dtype, device and kernels, the head's decoder layers over its own paged KV (and
their forward past layer 0's input norm, which differs), its rotary table, and its embedding
(its own when the checkpoint ships one, else the target's)."""

from __future__ import annotations

import torch
from torch import nn
from troupe.gpu.attention import AttentionMetadata
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, DecoderModel, KVCache, set_layer_kv_scales
from troupe.gpu.quant_linear import embedding
from troupe.kernels.rope_cache import build_cos_sin_cache


class EagleHeadBase(nn.Module):
    """The layers, the rotary table and the embedding of a head drafting for `target`."""

    def __init__(
        self,
        config: ModelConfig,
        target: DecoderModel,
        *,
        max_positions: int,
        own_embedding: bool,
    ) -> None:
        super().__init__()
        c, dtype, device = config, target.dtype, target.device
        self.config = c
        self.dtype = dtype
        self.device = device
        self.ops = target.ops
        self.layers = nn.ModuleList(DecoderLayer(c, dtype, device, i) for i in range(c.num_layers))
        self.embed_tokens = self.param(c.vocab_size, c.hidden_size) if own_embedding else None
        assert own_embedding or c.hidden_size == target.config.hidden_size, (
            f"a head {c.hidden_size} wide cannot share the model's embedding "
            f"({target.config.hidden_size} wide): the loader checks it"
        )
        # not submodules: the target's weights stay the target's (no second copy, no .to())
        self._target_embed = target.embed
        self.logits_dtype = target.logits_dtype
        self.register_buffer(
            "cos_sin_cache",
            build_cos_sin_cache(
                c.head_dim, max_positions, c.rope_theta, c.rope_scaling, torch.float32, device
            ),
            persistent=False,
        )

    def param(self, *shape: int) -> nn.Parameter:
        """An uninitialized weight in the head's dtype and device (the loader fills it)."""
        empty = torch.empty(*shape, dtype=self.dtype, device=self.device)
        return nn.Parameter(empty, requires_grad=False)

    def first_layer(self) -> DecoderLayer:
        first = self.layers[0]
        assert isinstance(first, DecoderLayer)
        return first

    def run_layers(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) after the layers: layer 0 from its attention on x (its input norm is
        the head's own: EAGLE-1 has none, EAGLE-3's input is 2H wide), `residual` added after
        that attention; then layers 1.. as decoder layers."""
        ops, eps = self.ops, self.config.rms_norm_eps
        cos_sin = self.get_buffer("cos_sin_cache")
        first = self.first_layer()
        attn = first.attention(x, positions, meta, kv_caches[0], cos_sin, ops)
        h, residual = ops.rms_norm(attn, first.post_attention_layernorm, eps, residual)
        x = first.mlp(h, ops)
        for layer, kv_cache in zip(self.layers[1:], kv_caches[1:], strict=True):
            assert isinstance(layer, DecoderLayer)
            x, residual = layer(x, residual, positions, meta, kv_cache, cos_sin, ops)
        return x, residual

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is None:
            return self._target_embed(input_ids)
        return embedding(input_ids, self.embed_tokens, self.dtype)

    def set_kv_scales(self, scales: torch.Tensor | None) -> None:
        """fp8 KV: the head pool's scales [layer, k | v, kv head] (as DecoderModel's)."""
        set_layer_kv_scales(self.layers, scales)
