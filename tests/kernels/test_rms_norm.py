"""rms_norm (plain and fused residual add) against the reference."""

from __future__ import annotations

import pytest
import torch
from troupe.kernels import reference
from troupe.kernels.ops import KernelOps
from troupe.kernels.rms_norm import rms_norm_triton

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "output has NaN: unwritten elements"
    return float((out.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hidden", [8, 40, 576])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(
    device: str, hidden: int, with_residual: bool, triton_ops: KernelOps
) -> None:
    dtype, bound = (torch.float32, 1e-5) if device == "cpu" else (torch.bfloat16, 1e-2)
    gen = torch.Generator().manual_seed(hidden * 2 + with_residual)
    num_rows = 7 if device == "cpu" else 1000
    x = (torch.randn(num_rows, hidden, generator=gen) * 3 + 0.5).to(device, dtype)
    weight = torch.randn(hidden, generator=gen).to(device, dtype)
    residual = (
        torch.randn(num_rows, hidden, generator=gen).to(device, dtype) if with_residual else None
    )
    out = torch.full_like(x, float("nan"))
    got, got_res = rms_norm_triton(x, weight, 1e-6, residual, out=out)
    ref, ref_res = reference.rms_norm(
        x.float(), weight.float(), 1e-6, None if residual is None else residual.float()
    )
    assert got.dtype == dtype and got.shape == x.shape
    assert _rel_err(got, ref) < bound
    assert _rel_err(got_res, ref_res) < bound
    if residual is None:
        assert got_res is x
    via_ops, _ = triton_ops.rms_norm(x, weight, 1e-6, residual)
    torch.testing.assert_close(via_ops, got, rtol=0, atol=0)


def test_rms_norm_reference_by_hand() -> None:
    x = torch.tensor([[3.0, 4.0]])
    out, res = reference.rms_norm(x, torch.tensor([1.0, 2.0]), 0.0, torch.tensor([[1.0, 0.0]]))
    # h = [4, 4]; rms = 4; normed = [1, 1]; times weight = [1, 2]
    assert out.tolist() == [[1.0, 2.0]]
    assert res.tolist() == [[4.0, 4.0]]
