"""GLM-4's decoder layer (transformers' Glm4DecoderLayer, GLM-4-0414): Gemma 3's sandwich of
norms around attention and the MLP, under other names, and a SwiGLU MLP.

    h = h + post_self_attn_layernorm(attention(input_layernorm(h)))
    h = h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))

So it is Gemma3Layer's forward with GLM's names read into Gemma's slots (its
post_attention_layernorm is the MLP's input norm, Gemma's pre_feedforward_layernorm); its
norms hold the weight as shipped (no 1 added: that is ModelConfig.is_gemma's). Its rotary is
partial and interleaved (ModelConfig.rotary_dim, rope_interleaved): the loader reorders q/k for
the kernels (gpu/rope_layers.py).
"""

from __future__ import annotations

import torch
from troupe.gpu.gemma3_layer import Gemma3Layer

# GLM's norm -> the Gemma3Layer slot that plays its part
_SLOTS = {
    "post_self_attn_layernorm.weight": "post_attention_layernorm",
    "post_attention_layernorm.weight": "pre_feedforward_layernorm",
    "post_mlp_layernorm.weight": "post_feedforward_layernorm",
}


class Glm4Layer(Gemma3Layer):
    """Gemma3Layer's sandwich norms, GLM's names, SwiGLU (its hidden_act: DecoderLayer.mlp)."""

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """GLM's three norms beside the input norm, in Gemma's slots."""
        slot = _SLOTS.get(rest)
        if slot is None:
            return None
        return getattr(self, slot), (f"{prefix}.{slot}",)
