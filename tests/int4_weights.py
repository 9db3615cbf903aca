"""Random Q4-style packed weights for the quantized-matmul kernel tests."""

from __future__ import annotations

import torch


def int4_weight(n: int, k: int, group: int, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    scale = torch.rand(n, k // group, generator=gen) * 0.02 + 0.001
    bias = -8 * scale + torch.randn(n, k // group, generator=gen) * 0.01
    half = torch.float32 if device == "cpu" else torch.float16
    return packed.to(device), scale.to(device, half), bias.to(device, half)
