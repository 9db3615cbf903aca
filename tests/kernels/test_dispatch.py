"""kernels.ops.select_ops: one dispatcher, two implementations, chosen by device and backend."""

from __future__ import annotations

import pytest
import torch
from troupe.config import ConfigError, EngineConfig
from troupe.kernels import reference, triton_ops
from troupe.kernels.ops import select_ops

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object needs no CUDA


@pytest.mark.parametrize(
    ("device", "backend", "expected"),
    [
        (CPU, "auto", reference),
        (CUDA, "auto", triton_ops),
        (CPU, "triton", triton_ops),
        (CUDA, "triton", triton_ops),
        (CPU, "torch", reference),
        (CUDA, "torch", reference),
    ],
)
def test_select_ops(device: torch.device, backend: str, expected: object) -> None:
    assert select_ops(device, backend) is expected  # type: ignore[arg-type]


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="kernel_backend"):
        select_ops(CPU, "cuda")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="kernel_backend"):
        EngineConfig(kernel_backend="cuda")  # type: ignore[arg-type]
