"""YaRN rope scaling (DeepSeek-V2/V3), with transformers' numbers (`_compute_yarn_parameters`).

inv_freq   per frequency, a blend of the interpolated (/ factor) and the original inverse
           frequency: original above the fast band (beta_fast rotations over the original
           context), interpolated below the slow one (beta_slow), a linear ramp between
attention  cos and sin are multiplied by attention_factor (default mscale(factor, mscale) /
           mscale(factor, mscale_all_dim), 1 when the two are equal as in DeepSeek's configs)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _float(scaling: Mapping[str, object], key: str, default: float | None = None) -> float:
    value = scaling.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, int | float):
        raise ValueError(f"yarn rope_scaling needs a number for {key!r}, got {value!r}")
    return float(value)


def yarn_attention_factor(scaling: Mapping[str, object]) -> float:
    """What cos and sin are multiplied by."""
    explicit = scaling.get("attention_factor")
    if explicit is not None:
        return _float(scaling, "attention_factor")
    factor = _float(scaling, "factor")
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all:
        return _mscale(factor, _float(scaling, "mscale")) / _mscale(
            factor, _float(scaling, "mscale_all_dim")
        )
    return _mscale(factor)


def yarn_inv_freq(head_dim: int, theta: float, scaling: Mapping[str, object]) -> torch.Tensor:
    """[head_dim // 2] fp32 YaRN inverse frequencies."""
    factor = _float(scaling, "factor")
    original = _float(scaling, "original_max_position_embeddings")
    beta_fast = _float(scaling, "beta_fast", 32.0) or 32.0
    beta_slow = _float(scaling, "beta_slow", 1.0) or 1.0

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).to(torch.float32) / head_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep
