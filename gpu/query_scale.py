"""Ministral 3's queries scaled by position (transformers' Ministral3Attention, after the
rotary, before attention),

    q = q * (1 + beta * log(1 + floor(position / length)))

beta the rope parameters' `llama_4_scaling_beta`, length the yarn scaling's
original_max_position_embeddings (ModelConfig.query_scale, read by gpu/hf_families.py). Up to
that length the factor is 1; past it the queries sharpen with the log of how many lengths have
gone by. Keys are not scaled, so the cache holds what Mistral's would.
"""

from __future__ import annotations

import torch


def position_scaled(
    q: torch.Tensor, positions: torch.Tensor, beta: float, length: int
) -> torch.Tensor:
    """q [T, Hq, D] times each token's factor (computed in fp32, applied in q's dtype)."""
    lengths = torch.div(positions, length, rounding_mode="floor").to(torch.float32)
    factor = 1.0 + beta * torch.log1p(lengths)
    return q * factor.to(q.dtype)[:, None, None]
