"""The column-layout fp8 matmuls (kernels/quant_fp8.py) against their torch reference and the
row layout's: the decode GEMV (K split, columns and blocks past the ends) and the GEMM, with
per-channel, per-tensor and block scales."""

from __future__ import annotations

import pytest
import torch
from troupe.gpu.fp8_weights import Fp8Weight
from troupe.kernels.arrival import arrival_counters
from troupe.kernels.quant_fp8 import Fp8Cols, Fp8ColsGemv, fp8_cols_matmul, fp8_cols_reference

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def fp8_weight(n: int, k: int, scale_shape: tuple[int, int]) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(n * k + scale_shape[0])
    weight = (torch.randn(n, k, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(*scale_shape, generator=gen) * 1e-3 + 1e-4
    return weight, scale


def test_column_layout_round_trips() -> None:
    weight, scale = fp8_weight(24, 64, (24, 1))
    cols = Fp8Cols.from_rows(weight, scale)
    assert cols.shape == (24, 64) and cols.words.shape == (16, 24) and cols.block == (1, 64)
    assert torch.equal(cols.rows().view(torch.uint8), weight.view(torch.uint8))
    index = torch.tensor([5, 1])
    assert torch.equal(cols.rows(index).view(torch.uint8), weight[index].view(torch.uint8))
    assert not Fp8Cols.fits(weight[:, :40], scale)  # K not a multiple of 16
    assert not Fp8Cols.fits(weight, torch.ones(24, 8))  # scale blocks of 8 codes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("m", "n", "k", "scale_rows", "scale_cols", "gemv"),
    [
        (1, 256, 128, 256, 1, Fp8ColsGemv(blocks=4)),  # per channel, K split in two
        (1, 200, 160, 1, 1, Fp8ColsGemv(block_n=256, blocks=4)),  # per tensor; columns past
        # N, 10 blocks of 16: the last split runs past K
        (1, 384, 256, 24, 8, Fp8ColsGemv(blocks=2, pdl=False)),  # blocks of 16 x 32
        (1, 128, 1024, 128, 1, None),  # the engine's launch
        (2, 96, 320, 6, 10, None),  # the GEMM, K split (a skinny batch)
        (40, 64, 128, 64, 1, None),
    ],
)
def test_fp8_cols_matmul(
    device: str,
    m: int,
    n: int,
    k: int,
    scale_rows: int,
    scale_cols: int,
    gemv: Fp8ColsGemv | None,
) -> None:
    if device == "cuda":
        n, k, scale_rows, scale_cols = n * 16, k * 16, scale_rows * 16, scale_cols * 16
        scale_cols = max(1, scale_cols if scale_cols > 16 else 1)
    weight, scale = fp8_weight(n, k, (scale_rows, scale_cols))
    cols = Fp8Cols.from_rows(weight, scale)
    cols = Fp8Cols(cols.words.to(device), cols.scale.to(device))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(device)
    if device == "cuda":
        x = x.to(torch.bfloat16)
    got = fp8_cols_matmul(x, cols, gemv).float()
    assert not arrival_counters(1, x.device)[:64].any()  # the last split set its count back
    want = fp8_cols_reference(x.float(), cols).float()
    rows = x.float().cpu() @ Fp8Weight(weight, scale).dequantize().T  # the loader's expansion
    assert torch.allclose(want.cpu(), rows, rtol=1e-5, atol=1e-4)  # the layouts agree
    bound = 1e-4 if device == "cpu" else 1e-2
    assert (got - want).abs().max() <= bound * want.abs().max()
    assert want.abs().max() > 0.1
