"""The packed-half2 decode GEMVs (kernels/quant_half2.py) against the torch references.

On the CPU (TRITON_INTERPRET=1) the kernels run their PLAIN path: the asm's arithmetic in
Triton, fp16 rounding included. On a GPU the PTX runs. Both accumulate up to 16 products per
fp16 lane (11-bit significand: each partial sum rounds to ~5e-4 of itself) before fp32 takes
over, so they are compared at 1e-2 of max |y| (bf16 output rounding alone is ~4e-3); the
indexing errors these tests are for (a nibble or code paired with the wrong x) are O(1)."""

from __future__ import annotations

import pytest
import torch
from fp8_weights import fp8_weight
from int4_weights import int4_weight
from troupe.kernels.quant_gemv import fp8_matmul, fp8_reference, int4_matmul, int4_reference
from troupe.kernels.quant_gemv_config import Fp8Gemv, Fp8GemvConfig, Int4Gemv, Int4GemvConfig
from troupe.kernels.quant_half2 import launch_shape

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
BOUND = 1e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("m", "n", "k", "block_n", "groups", "k_splits"),
    [
        (1, 10, 96, 4, 2, 1),  # rows not a multiple of block_n, groups not of the tile's
        (3, 8, 64, 2, 4, 1),  # 3 x rows
        (2, 12, 256, 4, 2, 3),  # K split 3 ways (4 chunks: cut to whole chunks, 2 + 2)
    ],
)
def test_int4_half2(
    device: str, m: int, n: int, k: int, block_n: int, groups: int, k_splits: int
) -> None:
    if device == "cuda":
        n, k, groups = n * 64, k * 32, 128
    packed, scale, bias = int4_weight(n, k, 32, device, seed=n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device)
    if device == "cuda":
        x = x.to(torch.bfloat16)
    config = Int4GemvConfig(Int4Gemv.HALF2, block_n, groups, k_splits=k_splits)
    got = int4_matmul(x, packed, scale, bias, 32, config).float()
    want = int4_reference(x.float(), packed, scale, bias, 32).float()
    assert (got - want).abs().max() <= BOUND * want.abs().max()
    assert want.abs().max() > 0.1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("m", "n", "k", "scale_shape", "block_w", "k_splits"),
    [
        (1, 10, 48, (10, 1), 8, 1),  # per channel, K not a multiple of the tile
        (3, 8, 64, (8, 1), 8, 1),  # 3 rows of x
        (1, 12, 256, (1, 2), 32, 1),  # 12 x 128 blocks
        (1, 40, 384, (40, 3), 16, 2),  # per row, 128 columns, K split in 2
        (2, 9, 512, (9, 1), 16, 0),  # K splits chosen (the CPU: 1)
    ],
)
def test_fp8_half2(
    device: str,
    m: int,
    n: int,
    k: int,
    scale_shape: tuple[int, int],
    block_w: int,
    k_splits: int,
) -> None:
    if device == "cuda":
        block_w = 128
    weight, scale = fp8_weight(n, k, scale_shape, device)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device)
    config = Fp8GemvConfig(Fp8Gemv.HALF2, block_n=4, block_w=block_w, k_splits=k_splits)
    got = fp8_matmul(x, weight, scale, config)
    want = fp8_reference(x, weight, scale)
    assert (got - want).abs().max() <= BOUND * want.abs().max()
    assert want.abs().max() > 0.1


def test_fp8_half2_unfit_falls_back() -> None:
    """K not a multiple of 16: the byte GEMV takes it, exactly."""
    weight, scale = fp8_weight(6, 36, (6, 1), "cpu")
    x = torch.randn(1, 36, generator=torch.Generator().manual_seed(2))
    got = fp8_matmul(x, weight, scale, Fp8GemvConfig(Fp8Gemv.HALF2, block_n=4, block_w=8))
    want = fp8_reference(x, weight, scale)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["int4", "fp8"])
def test_half2_large_x_gpu(form: str) -> None:
    """|x| up to 8192 (the fp16 bound is 2^14): no overflow after the power-of-two x scale."""
    n, k = 512, 4096
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(5)) * 2000
    x = x.clamp(-8192, 8192).to("cuda", torch.bfloat16)
    if form == "int4":
        packed, scale, bias = int4_weight(n, k, 32, "cuda", seed=7)
        config = Int4GemvConfig(Int4Gemv.HALF2, 8, 128)
        got = int4_matmul(x, packed, scale, bias, 32, config).float()
        want = int4_reference(x.float(), packed, scale, bias, 32).float()
    else:
        # |q| <= 448 everywhere: the bound's worst case
        weight, scale = fp8_weight(n, k, (n, 1), "cuda")
        config8 = Fp8GemvConfig(Fp8Gemv.HALF2, block_n=8, block_w=512)
        got = fp8_matmul(x, weight, scale, config8).float()
        want = fp8_reference(x.float(), weight, scale).float()
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= BOUND * want.abs().max()


@pytest.mark.parametrize(
    ("block_n", "n", "chunks", "want"),
    [
        (8, 28672, 1, (8, 1)),  # gate_up: 3,584 programs
        (32, 4096, 1, (8, 1)),  # o: 128 and 256 programs are under 3 per SM; 512 at 8 rows
        (8, 4096, 4, (8, 2)),  # down: 512 tiles, 2 splits make ~4 programs per SM
        (8, 4096, 3, (8, 1)),  # 2 splits do not divide 3 chunks
        (4, 64, 1, (2, 1)),  # never under 2 rows
    ],
)
def test_launch_shape(block_n: int, n: int, chunks: int, want: tuple[int, int]) -> None:
    """k_splits 0 on an H200 (132 SMs), one x row; a configured count is cut to the chunks."""
    assert launch_shape(block_n, 0, n, 1, chunks, 132) == want
    assert launch_shape(block_n, 3, n, 1, chunks, 132) == (block_n, min(3, chunks))
    assert launch_shape(block_n, 0, n, 1, chunks, None) == (block_n, 1)
