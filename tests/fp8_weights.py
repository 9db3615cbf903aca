"""Random e4m3 weights with block scales for the quantized-matmul kernel tests."""

from __future__ import annotations

import torch


def fp8_weight(
    n: int, k: int, scale_shape: tuple[int, int], device: str
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(n * k)
    # every e4m3 code but NaN (0x7F, 0xFF): subnormals, zeros of both signs, +-448
    codes = torch.randint(0, 255, (n, k), generator=gen, dtype=torch.uint8)
    codes[codes == 0x7F] = 0x7E
    weight = codes.view(torch.float8_e4m3fn)
    scale = torch.rand(*scale_shape, generator=gen) * 1e-3 + 1e-4
    return weight.to(device), scale.to(device)
