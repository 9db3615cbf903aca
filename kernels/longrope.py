"""LongRoPE scaling (Phi-3.5, Phi-4-mini, Phi-3 128k), with transformers' numbers
(`_compute_longrope_parameters`).

inv_freq   1 / (ext_factor[i] * theta ** (2i / dim)), ext_factor being long_factor or
           short_factor
attention  cos and sin are multiplied by attention_factor (default sqrt(1 + ln(factor) /
           ln(original_max_position_embeddings)), 1 when factor <= 1)

Which factors: one set for the engine, long_factor when its table spans more positions than the
pretraining length (original_max_position_embeddings), as vLLM picks by max_model_len. A
sequence's cached keys then never change as it grows. transformers' Phi-3 starts a sequence
short and, once it grows past that length, re-encodes all of it with long_factor (its
generate() drops the cache there): the same rotation for a sequence that long, which is what the
long factors were trained for; a short sequence in an engine of long max_model_len rotates
differently from transformers', a trade vLLM makes too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch


def longrope_table(
    head_dim: int, max_pos: int, theta: float, scaling: Mapping[str, object]
) -> torch.Tensor:
    """[max_pos, head_dim] fp32: cos in the first half, sin in the second, times the attention
    factor; the long factors when max_pos exceeds original_max_position_embeddings. `scaling`
    as gpu/rope_layers.rope_scaling completes it (both factor lists, factor, that length)."""
    original = _number(scaling, "original_max_position_embeddings")
    key = "long_factor" if max_pos > original else "short_factor"
    positions = torch.arange(max_pos, dtype=torch.int64).to(torch.float32)[:, None]
    angles = positions * _inv_freq(head_dim, theta, scaling, key)[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1) * attention_factor(scaling)


def attention_factor(scaling: Mapping[str, object]) -> float:
    given = scaling.get("attention_factor")
    if given is not None:
        return _number(scaling, "attention_factor")
    factor = _number(scaling, "factor")
    original = _number(scaling, "original_max_position_embeddings")
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def _inv_freq(head_dim: int, theta: float, scaling: Mapping[str, object], key: str) -> torch.Tensor:
    factors = scaling.get(key)
    if not isinstance(factors, Sequence) or len(factors) != head_dim // 2:
        count = len(factors) if isinstance(factors, Sequence) else factors
        raise ValueError(
            f"longrope rope_scaling {key} has {count!r} entries; expected {head_dim // 2} "
            "(half the rotated dims of a head)"
        )
    ext = torch.tensor([float(f) for f in factors], dtype=torch.float32)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (ext * theta**exponents)


def _number(scaling: Mapping[str, object], key: str) -> float:
    value = scaling.get(key)
    if not isinstance(value, int | float):
        raise ValueError(f"longrope rope_scaling needs a number for {key!r}, got {value!r}")
    return float(value)
