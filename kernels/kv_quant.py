"""fp8 (e4m3) KV cache: one scale per layer and KV head, set from the data at its first write.

    stored = fp8(clamp(x / scale, -448, 448))        (round to nearest even, as the GPU casts)
    x      ~ float(stored) * scale

A scale starts at 0 (unset). Every KV write first runs `update_kv_scales`: heads whose scale is
still 0 get bound / 448 * HEADROOM, where `bound` is the largest magnitude this batch's keys
(after q/k norm and rotary) and values can take; set scales never change, so stored blocks stay
valid. Rotary turns each pair (x_i, x_i+D/2) by an angle, so no rotated element exceeds the
pair's norm: that norm, computed before rotary, bounds the keys without rotating them. All of
it is device-side (torch.where, no host sync), so a CUDA graph captures it; the runner zeroes
the scales after its warm-up forwards, so the first real batch sets them. Later values beyond
the range saturate at +-448 * scale (HEADROOM leaves room for larger ones than the first seen).
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
HEADROOM = 4.0


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8_DTYPE


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [N, Hkv, D] -> fp8 with per-head scale [Hkv]; the kernels round the same way."""
    return (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 [..., Hkv, D] -> fp32 with per-head scale [Hkv]."""
    return x.float() * scale[:, None]


def update_kv_scales(
    qkv: torch.Tensor,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    num_kv_heads: int,
    head_dim: int,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> None:
    """In place: unset (0) per-head scales [Hkv] from this batch's k and v (qkv [T, W])."""
    if qkv.shape[0] == 0:
        return
    kv_size = num_kv_heads * head_dim
    k, v = qkv[:, -2 * kv_size : -kv_size], qkv[:, -kv_size:]
    k = k.float().reshape(-1, num_kv_heads, head_dim)
    if k_norm_weight is not None:
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * k_norm_weight.float()
    half = head_dim // 2
    pair_norm = torch.sqrt(k[..., :half].pow(2) + k[..., half:].pow(2))  # >= |rotated k|
    k_bound = pair_norm.amax(dim=(0, 2))
    v_bound = v.float().reshape(-1, num_kv_heads, head_dim).abs().amax(dim=(0, 2))
    for scale, bound in ((k_scale, k_bound), (v_scale, v_bound)):
        new = torch.clamp(bound, min=1e-6) * (HEADROOM / FP8_MAX)
        scale.copy_(torch.where(scale > 0, scale, new))
