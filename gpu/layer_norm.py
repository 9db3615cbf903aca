"""LayerNorm as Cohere's models normalise (transformers' CohereLayerNorm, no bias) and
StarCoder2's (torch's LayerNorm, with one): the mean taken out, divided by the root of the
variance plus eps, times the weight (plus the bias), in fp32, then back to the input's dtype.
`layer_norm` has KernelOps.rms_norm's signature (the residual added first, the sum returned
beside the normed rows), so a model's final norm is either; `head_layer_norm` normalises
each head of q or k on its own (Command R+'s use_qk_norm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(LayerNorm(x + residual) * weight + bias, x + residual); x when there is no residual."""
    if residual is not None:
        x = x + residual
    shift = None if bias is None else bias.float()
    normed = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), shift, eps)
    return normed.to(x.dtype), x


def head_layer_norm(
    rows: torch.Tensor, weight: torch.Tensor, head_dim: int, eps: float
) -> torch.Tensor:
    """Rows [T, H * head_dim] with each head's values LayerNorm'd on their own, times that
    head's weights (weight [H * head_dim], head after head)."""
    heads = rows.float().reshape(rows.shape[0], -1, head_dim)
    normed = F.layer_norm(heads, (head_dim,), None, None, eps) * weight.float().view(-1, head_dim)
    return normed.reshape(rows.shape).to(rows.dtype)
