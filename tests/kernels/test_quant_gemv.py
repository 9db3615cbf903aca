"""Quantized-weight matmuls (kernels/quant_gemv.py) against their torch references: decode
(GEMV, split K) and prefill (tile expanded, tl.dot) shapes, int4 groups and fp8 block scales."""

from __future__ import annotations

import pytest
import torch
from int4_weights import int4_weight
from troupe.kernels.quant_gemv import (
    GEMV_MAX_ROWS,
    SKINNY_MAX_ROWS,
    fp8_matmul,
    fp8_reference,
    int4_matmul,
    int4_reference,
)
from troupe.kernels.quant_gemv_config import Fp8Gemv, Fp8GemvConfig, Int4Gemv, Int4GemvConfig

# this file's GEMVs are the fp32 byte kernels (the engine's defaults, HALF2, sum in fp16: their
# bounds are tests/kernels/test_quant_half2.py's)
BYTES = Int4GemvConfig(Int4Gemv.BYTES)
FP8_BYTES = Fp8GemvConfig(Fp8Gemv.BYTES)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("m", "n", "k"),
    # the GEMV, the skinny kernel at both ends of its rows, the prefill tiles
    [(1, 40, 128), (3, 96, 320), (SKINNY_MAX_ROWS, 64, 512), (SKINNY_MAX_ROWS + 1, 72, 192)],
)
def test_int4_matmul(device: str, m: int, n: int, k: int) -> None:
    if device == "cuda":
        n, k = n * 32, k * 16
    packed, scale, bias = int4_weight(n, k, 32, device, seed=m + n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device)
    if device == "cuda":
        x = x.to(torch.bfloat16)
    got = int4_matmul(x, packed, scale, bias, 32, BYTES).float()
    want = int4_reference(x.float(), packed, scale, bias, 32).float()
    bound = 1e-4 if device == "cpu" else 2e-2
    assert (got - want).abs().max() <= bound * want.abs().max()
    assert want.abs().max() > 0.1


def fp8_weight(
    n: int, k: int, scale_shape: tuple[int, int], device: str
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(n * k)
    weight = (torch.randn(n, k, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(*scale_shape, generator=gen) * 1e-3 + 1e-4
    return weight.to(device), scale.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("m", "n", "k", "scale_shape"),
    [
        (1, 48, 256, (48, 1)),  # per channel
        (2, 40, 384, (1, 3)),  # 40 x 128 blocks (the last partial)
        (GEMV_MAX_ROWS + 3, 64, 256, (1, 2)),  # skinny, 64 x 128 blocks
        (GEMV_MAX_ROWS + 1, 80, 192, (80, 1)),
        (SKINNY_MAX_ROWS + 2, 64, 256, (1, 2)),  # prefill
    ],
)
def test_fp8_matmul(device: str, m: int, n: int, k: int, scale_shape: tuple[int, int]) -> None:
    weight, scale = fp8_weight(n, k, scale_shape, device)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device)
    got = fp8_matmul(x, weight, scale, FP8_BYTES)
    want = fp8_reference(x, weight, scale)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert want.abs().max() > 0.1
