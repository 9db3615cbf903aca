"""Ministral 3's queries scaled by position (transformers' Ministral3Attention, after the
rotary, before attention),

    q = q * (1 + beta * log(1 + floor(position / length)))

beta the rope parameters' `llama_4_scaling_beta`, length the yarn scaling's
original_max_position_embeddings (ModelConfig.query_scale, read by gpu/hf_families.py). Up to
that length the factor is 1; past it the queries sharpen with the log of how many lengths have
gone by. Keys are not scaled, so the cache holds what Mistral's would. The factors are one fp32
table over the model's positions, built once (as the rotary tables are) and shared by every
layer, so a step reads each token's factor instead of computing it once a layer.
"""

from __future__ import annotations

import torch
from torch import nn
from troupe.gpu.model_config import ModelConfig


def factor_table(
    beta: float, length: int, max_positions: int, device: torch.device
) -> torch.Tensor:
    """fp32 [max_positions]: each position's factor."""
    lengths = torch.div(torch.arange(max_positions, device=device), length, rounding_mode="floor")
    return 1.0 + beta * torch.log1p(lengths.to(torch.float32))


def install_query_factors(
    layers: nn.ModuleList, config: ModelConfig, max_positions: int, device: torch.device
) -> None:
    """Give every layer (DecoderLayer.query_factors) the model's factor table; a model without
    the scale leaves them None."""
    if config.query_scale is None:
        return
    factors = factor_table(*config.query_scale, max_positions, device)
    for layer in layers:
        layer.query_factors = factors


def position_scaled(
    q: torch.Tensor, positions: torch.Tensor, factors: torch.Tensor
) -> torch.Tensor:
    """q [T, Hq, D] times each token's factor (fp32 in the table, applied in q's dtype)."""
    return q * factors[positions].to(q.dtype)[:, None, None]
