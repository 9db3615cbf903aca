"""The cos/sin table that kernels.rotary reads: plain RoPE, linear, llama3, yarn and longrope
rope_scaling.

Numbers match HF transformers (`_compute_default_rope_parameters`, `_compute_llama3_parameters`):
inverse frequencies in fp32 from an int64 arange, angles = position * inv_freq in fp32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .longrope import longrope_table
from .yarn_rope import yarn_attention_factor, yarn_inv_freq


def rope_inv_freq(
    head_dim: int, theta: float, scaling: Mapping[str, object] | None
) -> torch.Tensor:
    """[head_dim // 2] fp32 inverse frequencies, llama3-scaled when scaling asks for it."""
    if head_dim % 2:
        raise ValueError(f"rotary head_dim must be even, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if rope_type in (None, "default"):
        return inv_freq
    assert scaling is not None
    if rope_type == "linear":  # positions / factor (Gemma 3's global layers)
        return inv_freq / _number(scaling, "factor")
    if rope_type == "yarn":  # DeepSeek-V2/V3 (kernels/yarn_rope.py)
        return yarn_inv_freq(head_dim, theta, scaling)
    if rope_type != "llama3":
        raise ValueError(
            f"rope_scaling type {rope_type!r} is not supported (default, linear, llama3, yarn)"
        )
    factor = _number(scaling, "factor")
    low_freq_factor = _number(scaling, "low_freq_factor")
    high_freq_factor = _number(scaling, "high_freq_factor")
    old_context_len = _number(scaling, "original_max_position_embeddings")
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Short wavelengths stay, long ones are divided by factor, the band between is interpolated.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def build_cos_sin_cache(
    head_dim: int,
    max_pos: int,
    theta: float,
    scaling: Mapping[str, object] | None,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    """[max_pos, head_dim]: cos(pos * inv_freq) in the first half, sin in the second (both
    times the attention factor under yarn and longrope scaling)."""
    if max_pos < 1:
        raise ValueError(f"max_pos must be >= 1, got {max_pos}")
    rope_type = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if scaling is not None and rope_type == "longrope":  # one of two frequency sets, by max_pos
        return longrope_table(head_dim, max_pos, theta, scaling).to(dtype=dtype, device=device)
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    angles = torch.arange(max_pos, dtype=torch.int64).to(torch.float32)[:, None] * inv_freq[None, :]
    table = torch.cat((angles.cos(), angles.sin()), dim=-1)
    if scaling is not None and rope_type == "yarn":
        table = table * yarn_attention_factor(scaling)
    return table.to(dtype=dtype, device=device)


def _number(scaling: Mapping[str, object], key: str) -> float:
    value = scaling.get(key)
    if not isinstance(value, int | float):
        raise ValueError(f"llama3 rope_scaling needs a number for {key!r}, got {value!r}")
    return float(value)
