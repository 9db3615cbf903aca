"""HunYuan dense's decoder layer (transformers' HunYuanDenseV1DecoderLayer): Llama's, but q and
k are RMS-normalised per head after the rotary, not before (self_attn.query_layernorm and
key_layernorm, one weight of head_dim each).

The fused q/k/v kernel normalises before it rotates. A rotation keeps a head's root mean
square, so normalising first with unit weights gives the rotated, normalised q and k exactly;
what is left is each dim's weight, which no rotation commutes with. In a score the two weights
meet dim by dim,

    q . k = sum_d (w_q[d] q'[d]) (w_k[d] k'[d]) = sum_d (w_q[d] w_k[d]) q'[d] k'[d],

so the queries take both (`scale_queries`, after the rotary) and the cache keeps k' as it is:
the same scores, and the values are not touched. The unit norms are buffers, not weights.
"""

from __future__ import annotations

import torch
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import DecoderLayer, new_param

# HunYuan's names -> this layer's parameters
_NAMES = {
    "self_attn.query_layernorm.weight": "query_norm",
    "self_attn.key_layernorm.weight": "key_norm",
}


class HunyuanLayer(DecoderLayer):
    """Llama's layer with q / k normalised after the rotary, as above."""

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        for name in ("q_norm", "k_norm"):  # unit weights: the fused kernel's norm, unweighted
            delattr(self, name)
            self.register_buffer(name, torch.ones(config.head_dim, dtype=dtype, device=device))
        self.query_norm = new_param(config.head_dim, dtype=dtype, device=device)
        self.key_norm = new_param(config.head_dim, dtype=dtype, device=device)

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The rotated queries [T, Hq, D] times both norms' weights, dim by dim."""
        return super().scale_queries(q, positions) * (self.query_norm * self.key_norm)

    def locate_extra(self, rest: str, prefix: str) -> tuple[torch.Tensor, tuple[str, ...]] | None:
        """The q / k norm weights under HunYuan's names."""
        name = _NAMES.get(rest)
        if name is None:
            return super().locate_extra(rest, prefix)
        return getattr(self, name), (f"{prefix}.{name}",)
