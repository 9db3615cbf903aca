"""silu_mul (SwiGLU on the fused gate_up output) against the reference."""

from __future__ import annotations

import math

import pytest
import torch
from troupe.kernels import reference
from troupe.kernels.ops import KernelOps
from troupe.kernels.silu_mul import gelu_tanh_mul_triton, silu_mul_triton

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inter", [8, 40, 1500])  # 1500: two column blocks, the last partial
def test_silu_mul_matches_reference(device: str, inter: int, triton_ops: KernelOps) -> None:
    dtype, bound = (torch.float32, 1e-6) if device == "cpu" else (torch.bfloat16, 1e-2)
    num_rows = 7 if device == "cpu" else 300
    if device == "cuda":
        inter *= 8
    gen = torch.Generator().manual_seed(inter)
    # Two extra columns: rows are not packed, so the kernel must honour stride(0).
    base = torch.randn(num_rows, 2 * inter + 2, generator=gen) * 3 + 0.2
    gate_up = base.to(device, dtype)[:, : 2 * inter]

    out = silu_mul_triton(gate_up)
    ref = reference.silu_mul(gate_up.float())

    assert out.shape == (num_rows, inter) and out.dtype == dtype and out.is_contiguous()
    assert not out.isnan().any()
    assert float((out.float() - ref).norm() / ref.norm()) < bound
    torch.testing.assert_close(triton_ops.silu_mul(gate_up), out, rtol=0, atol=0)


def test_silu_mul_reference_by_hand() -> None:
    gate_up = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    expected = [1.0 / (1 + math.exp(-1.0)) * 3.0, -2.0 / (1 + math.exp(2.0)) * 0.5]
    torch.testing.assert_close(reference.silu_mul(gate_up)[0], torch.tensor(expected))


def test_silu_mul_rejects_odd_width() -> None:
    with pytest.raises(ValueError, match="odd"):
        silu_mul_triton(torch.ones(2, 5))


@pytest.mark.parametrize("device", DEVICES)
def test_gelu_tanh_mul_matches_reference(device: str, triton_ops: KernelOps) -> None:
    dtype, bound = (torch.float32, 1e-6) if device == "cpu" else (torch.bfloat16, 1e-2)
    gen = torch.Generator().manual_seed(5)
    gate_up = (torch.randn(9, 2 * 1500 + 2, generator=gen) * 3).to(device, dtype)[:, :3000]
    out = gelu_tanh_mul_triton(gate_up)
    ref = reference.gelu_tanh_mul(gate_up.float())
    assert out.shape == (9, 1500) and not out.isnan().any()
    assert float((out.float() - ref).norm() / ref.norm()) < bound
    torch.testing.assert_close(triton_ops.gelu_tanh_mul(gate_up), out, rtol=0, atol=0)


def test_gelu_tanh_mul_reference_by_hand() -> None:
    x = 0.7
    gelu = 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    out = reference.gelu_tanh_mul(torch.tensor([[x, 2.0]]))
    torch.testing.assert_close(out[0], torch.tensor([gelu * 2.0]))
