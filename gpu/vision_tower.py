"""CLIP's and SigLIP's vision transformers, as far as a multimodal projector reads them.

    pixels [N, C, S, S] --conv(P, stride P)--> patches [N, (S/P)^2, D]
      CLIP:   [class_embedding; patches] + positions, then pre_layrnorm
      SigLIP:  patches + positions
    encoder layer (pre-norm, bidirectional):
      h = h + out_proj(attention(q_proj, k_proj, v_proj of layer_norm1(h)))
      h = h + fc2(act(fc1(layer_norm2(h))))
    post_layernorm on the last state (Gemma 3 reads it; LLaVA reads earlier states raw)

Submodules carry transformers' names below `vision_model.` (embeddings.patch_embedding,
encoder.layers.3.self_attn.q_proj, ...), so the loader matches tensors by name. Only the
layers up to the deepest state the projector reads are built, and post_layernorm only where
it is read. SigLIP's attention-pooling head is not built: no projector reads it. The
position embeddings are used at the config's image size only (no interpolation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from troupe.gpu.vision_config import ACTIVATIONS, VisionConfig


def new_param(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    """An empty frozen weight the loader fills (gpu/models.py's, whose module pulls in the
    decoder stack: the encoder stays importable on its own)."""
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class Affine(nn.Module):
    """A weight and an optional bias: a linear layer's, a LayerNorm's or a conv's."""

    def __init__(
        self, *shape: int, bias: bool = True, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.weight = new_param(*shape, dtype=dtype, device=device)
        self.bias = new_param(shape[0], dtype=dtype, device=device) if bias else None

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def layer_norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, eps)


class Embeddings(nn.Module):
    """Patches, CLIP's class row, learned positions."""

    def __init__(self, c: VisionConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        d, p, clip = c.hidden_size, c.patch_size, c.tower == "clip"
        self.patch_size = p
        # CLIP's conv has no bias, SigLIP's has one
        self.patch_embedding = Affine(d, c.num_channels, p, p, bias=not clip, dtype=dtype,
                                      device=device)  # fmt: skip
        self.position_embedding = Affine(c.num_positions, d, bias=False, dtype=dtype, device=device)
        self.class_embedding = new_param(d, dtype=dtype, device=device) if clip else None

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        conv = self.patch_embedding
        patches = F.conv2d(pixels, conv.weight, conv.bias, stride=self.patch_size)
        rows = patches.flatten(2).transpose(1, 2)  # [N, patches, D], row-major over the grid
        if self.class_embedding is not None:
            cls = self.class_embedding.expand(rows.shape[0], 1, -1)
            rows = torch.cat([cls, rows], dim=1)
        return rows + self.position_embedding.weight


class SelfAttention(nn.Module):
    def __init__(self, c: VisionConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        d = c.hidden_size
        self.num_heads = c.num_heads
        self.q_proj = Affine(d, d, dtype=dtype, device=device)
        self.k_proj = Affine(d, d, dtype=dtype, device=device)
        self.v_proj = Affine(d, d, dtype=dtype, device=device)
        self.out_proj = Affine(d, d, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape

        def heads(proj: Affine) -> torch.Tensor:  # [N, T, D] -> [N, H, T, D / H]
            return proj.linear(x).view(n, t, self.num_heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj), heads(self.k_proj),
                                             heads(self.v_proj))  # fmt: skip
        return self.out_proj.linear(out.transpose(1, 2).reshape(n, t, d))


class Mlp(nn.Module):
    def __init__(self, c: VisionConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.act = ACTIVATIONS[c.hidden_act]
        self.fc1 = Affine(c.intermediate_size, c.hidden_size, dtype=dtype, device=device)
        self.fc2 = Affine(c.hidden_size, c.intermediate_size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2.linear(self.act(self.fc1.linear(x)))


class EncoderLayer(nn.Module):
    def __init__(self, c: VisionConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = c.layer_norm_eps
        self.layer_norm1 = Affine(c.hidden_size, dtype=dtype, device=device)
        self.self_attn = SelfAttention(c, dtype, device)
        self.layer_norm2 = Affine(c.hidden_size, dtype=dtype, device=device)
        self.mlp = Mlp(c, dtype, device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.layer_norm1.layer_norm(h, self.eps))
        out: torch.Tensor = h + self.mlp(self.layer_norm2.layer_norm(h, self.eps))
        return out


class Encoder(nn.Module):
    def __init__(self, c: VisionConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(c, dtype, device) for _ in range(c.num_layers_run))


class VisionTower(nn.Module):
    """CLIP or SigLIP (VisionConfig.tower): pixels in, the hidden states a projector reads out."""

    def __init__(self, config: VisionConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        c = config
        self.config = c
        self.embeddings = Embeddings(c, dtype, device)
        self.pre_layrnorm = self._norm(dtype, device) if c.tower == "clip" else None
        self.encoder = Encoder(c, dtype, device)
        self.post_layernorm = self._norm(dtype, device) if c.projector == "gemma3" else None

    def _norm(self, dtype: torch.dtype, device: torch.device) -> Affine:
        return Affine(self.config.hidden_size, dtype=dtype, device=device)

    def forward(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        """hidden_states[i] for i in config.feature_layers, in that order (hidden_states[0]:
        the embeddings); Gemma 3's one state after post_layernorm."""
        c = self.config
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != (c.num_channels,) + (c.image_size,) * 2:
            raise ValueError(
                f"pixels of shape {list(pixels.shape)}: the tower takes "
                f"[N, {c.num_channels}, {c.image_size}, {c.image_size}]"
            )
        wanted = c.feature_layers
        h = self.embeddings(pixels)
        if self.pre_layrnorm is not None:
            h = self.pre_layrnorm.layer_norm(h, c.layer_norm_eps)
        states = {0: h}
        for index, layer in enumerate(self.encoder.layers, start=1):
            h = layer(h)
            if index in wanted:
                states[index] = h
        if self.post_layernorm is not None:
            states[c.num_layers] = self.post_layernorm.layer_norm(h, c.layer_norm_eps)
        return [states[i] for i in wanted]
