"""The wide decode GEMVs (kernels/quant_wide.py): every int4 and fp8 variant against the torch
dequantized references, through int4_matmul / fp8_matmul with an explicit config."""

from __future__ import annotations

import pytest
import torch
from fp8_weights import fp8_weight
from int4_weights import int4_weight
from troupe.kernels.quant_gemv import fp8_matmul, fp8_reference, int4_matmul, int4_reference
from troupe.kernels.quant_wide import Fp8Gemv, Fp8GemvConfig, Int4Gemv, Int4GemvConfig

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
INT4_WIDE = [v for v in Int4Gemv if v not in (Int4Gemv.BYTES, Int4Gemv.HALF2)]
FP8_WIDE = [v for v in Fp8Gemv if v not in (Fp8Gemv.BYTES, Fp8Gemv.HALF2)]  # half2: its own test


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("variant", "x_split"),
    [(v, False) for v in INT4_WIDE] + [(Int4Gemv.WIDE_FOLD, True), (Int4Gemv.WIDE_MAGIC, True)],
)
@pytest.mark.parametrize(
    ("m", "n", "k", "block_n", "groups"), [(1, 10, 96, 4, 2), (3, 8, 64, 2, 4)]
)
def test_int4_wide(
    device: str,
    variant: Int4Gemv,
    x_split: bool,
    m: int,
    n: int,
    k: int,
    block_n: int,
    groups: int,
) -> None:
    """Rows of W not a multiple of block_n, groups not a multiple of the tile's."""
    if device == "cuda":
        n, k, groups = n * 64, k * 32, groups * 8
    packed, scale, bias = int4_weight(n, k, 32, device, seed=n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device)
    if device == "cuda":
        x = x.to(torch.bfloat16)
    config = Int4GemvConfig(variant, block_n=block_n, groups=groups, x_split=x_split)
    got = int4_matmul(x, packed, scale, bias, 32, config).float()
    want = int4_reference(x.float(), packed, scale, bias, 32).float()
    bound = 1e-5 if device == "cpu" else 2e-2
    assert (got - want).abs().max() <= bound * want.abs().max()
    assert want.abs().max() > 0.1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("variant", "x_split"),
    [(v, False) for v in FP8_WIDE] + [(Fp8Gemv.WIDE_MAGIC, True), (Fp8Gemv.WIDE_CVT, True)],
)
@pytest.mark.parametrize(
    ("m", "n", "k", "scale_shape", "block_w"),
    [
        (1, 10, 36, (10, 1), 4),  # per channel, K not a multiple of the tile
        (3, 8, 64, (8, 1), 8),  # 3 rows of x
        (1, 12, 256, (1, 2), 64),  # 12 x 128 blocks: tile cut to 32 words
        (1, 40, 384, (40, 3), 16),  # per row, 128 columns
    ],
)
def test_fp8_wide(
    device: str,
    variant: Fp8Gemv,
    x_split: bool,
    m: int,
    n: int,
    k: int,
    scale_shape: tuple[int, int],
    block_w: int,
) -> None:
    weight, scale = fp8_weight(n, k, scale_shape, device)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device)
    config = Fp8GemvConfig(variant, block_n=4, block_w=block_w, x_split=x_split)
    got = fp8_matmul(x, weight, scale, config)
    want = fp8_reference(x, weight, scale)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert want.abs().max() > 0.1


def test_fp8_magic_subnormals() -> None:
    """The bit-moved e4m3 conversion is exact on subnormal and tiny codes too (a row of them)."""
    codes = torch.arange(0, 16, dtype=torch.uint8).repeat(2, 4)  # +0 .. 2^-6 * 1.875
    codes[1] |= 0x80  # and their negatives
    weight = codes.view(torch.float8_e4m3fn)
    scale = torch.ones(2, 1)
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(3))
    got = fp8_matmul(x, weight, scale, Fp8GemvConfig(Fp8Gemv.WIDE_MAGIC, block_n=2, block_w=8))
    want = fp8_reference(x, weight, scale)
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()
    assert want.abs().max() > 1e-3
