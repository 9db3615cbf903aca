"""Apertus's decoder layer (transformers' ApertusDecoderLayer, Swiss AI's Apertus 8B / 70B):
Llama's layer with Qwen3's q / k norms per head before the rotary (ModelConfig.qk_norm), its
two norms named attention_layernorm and feedforward_layernorm, and an MLP without a gate whose
activation is xIELU (gpu/starcoder2_layer.UngatedMlpLayer, up_proj -> xIELU -> down_proj):

    xIELU(x) = alpha_p x^2 + beta x                          x > 0
               alpha_n (expm1(min(x, eps)) - x) + beta x     otherwise

with alpha_p = softplus(a_p) and alpha_n = beta + softplus(a_n), from each layer's own learned
scalars (mlp.act_fn.alpha_p, alpha_n; beta and eps beside them), computed in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from troupe.gpu.model_config import ModelConfig
from troupe.gpu.models import new_param
from troupe.gpu.starcoder2_layer import UP_DOWN, UngatedMlpLayer

_NAMES = UP_DOWN | {
    "attention_layernorm.weight": "input_layernorm",
    "feedforward_layernorm.weight": "post_attention_layernorm",
    "mlp.act_fn.alpha_p": "alpha_p",
    "mlp.act_fn.alpha_n": "alpha_n",
    "mlp.act_fn.beta": "beta",
    "mlp.act_fn.eps": "eps",
}


class ApertusLayer(UngatedMlpLayer):
    """The layer above."""

    names = _NAMES

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, layer_index: int = 0
    ) -> None:
        super().__init__(config, dtype, device, layer_index)
        self.alpha_p = new_param(1, dtype=dtype, device=device)
        self.alpha_n = new_param(1, dtype=dtype, device=device)
        self.beta = torch.nn.Parameter(torch.empty((), dtype=dtype, device=device), False)
        self.eps = torch.nn.Parameter(torch.empty((), dtype=dtype, device=device), False)

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """xIELU, in fp32."""
        h, beta = x.float(), self.beta.float()
        alpha_p = F.softplus(self.alpha_p.float())
        alpha_n = beta + F.softplus(self.alpha_n.float())
        positive = alpha_p * h * h + beta * h
        negative = (torch.expm1(torch.minimum(h, self.eps.float())) - h) * alpha_n + beta * h
        return torch.where(h > 0, positive, negative).to(x.dtype)
