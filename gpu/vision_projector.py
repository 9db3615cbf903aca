"""The projectors that turn a vision tower's rows into text-model embeddings.

    LLaVA     states [N, T, Dv] (one per feature layer) -> drop row 0 ("default") ->
              concat on features [N, T', k*Dv] -> linear_1 -> act -> linear_2 -> [N, T', Dt]
    Gemma 3   last state [N, s*s, Dv] -> grid [N, Dv, s, s] -> avg pool (s/m) -> [N, m*m, Dv]
              -> RMSNorm, x * (1 + w) in fp32 -> @ mm_input_projection_weight [Dv, Dt]

Parameter names are transformers' below `multi_modal_projector.`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from troupe.gpu.vision_config import ACTIVATIONS, VisionConfig
from troupe.gpu.vision_tower import Affine, new_param


class LlavaProjector(nn.Module):
    """linear_1, act, linear_2 over the chosen states' rows (biases per
    multimodal_projector_bias)."""

    def __init__(self, config: VisionConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        c = config
        width = c.hidden_size * len(c.feature_layers)
        bias = c.multimodal_projector_bias
        self.drop_first = c.vision_feature_select_strategy == "default"
        self.act = ACTIVATIONS[c.projector_hidden_act]
        self.linear_1 = Affine(c.text_hidden_size, width, bias=bias, dtype=dtype, device=device)
        self.linear_2 = Affine(c.text_hidden_size, c.text_hidden_size, bias=bias, dtype=dtype,
                               device=device)  # fmt: skip

    def forward(self, states: list[torch.Tensor]) -> torch.Tensor:
        if self.drop_first:  # CLIP's class row (transformers drops row 0 whatever the tower)
            states = [s[:, 1:] for s in states]
        rows = states[0] if len(states) == 1 else torch.cat(states, dim=-1)
        return self.linear_2.linear(self.act(self.linear_1.linear(rows)))


class GemmaRmsNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), in fp32, back to x's dtype."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param(size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3Projector(nn.Module):
    """Average-pools the patch grid to mm_tokens_per_image rows, norms, projects."""

    def __init__(self, config: VisionConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        c = config
        self.side = c.patches_per_side
        self.kernel = c.patches_per_side // round(c.mm_tokens_per_image**0.5)
        self.mm_soft_emb_norm = GemmaRmsNorm(c.hidden_size, c.layer_norm_eps, dtype, device)
        self.mm_input_projection_weight = new_param(c.hidden_size, c.text_hidden_size,
                                                    dtype=dtype, device=device)  # fmt: skip

    def forward(self, states: list[torch.Tensor]) -> torch.Tensor:
        (last,) = states
        n, _, d = last.shape
        grid = last.transpose(1, 2).reshape(n, d, self.side, self.side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        normed: torch.Tensor = self.mm_soft_emb_norm(pooled)
        return normed @ self.mm_input_projection_weight


def make_projector(config: VisionConfig, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The projector VisionConfig.projector names."""
    if config.projector == "llava":
        return LlavaProjector(config, dtype, device)
    return Gemma3Projector(config, dtype, device)
