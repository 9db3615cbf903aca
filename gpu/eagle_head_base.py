"""What an EAGLE-1 head (gpu/eagle_model.py) and an EAGLE-3 head (gpu/eagle3_model.py) share:
the target's dtype, device and kernels, the head's decoder layers over its own paged KV, its
rotary table, and its embedding (its own when the checkpoint ships one, else the target's)."""

from __future__ import annotations

import torch
from torch import nn
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, DecoderModel, set_layer_kv_scales
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

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is None:
            return self._target_embed(input_ids)
        return embedding(input_ids, self.embed_tokens, self.dtype)

    def set_kv_scales(self, scales: torch.Tensor | None) -> None:
        """fp8 KV: the head pool's scales [layer, k | v, kv head] (as DecoderModel's)."""
        set_layer_kv_scales(self.layers, scales)
