"""The Triton kernels as the model calls them, through the one dispatcher (kernels.ops)."""

from __future__ import annotations

import pytest
import torch
from troupe.kernels.ops import KernelOps, select_ops


@pytest.fixture
def triton_ops() -> KernelOps:
    """The Triton implementation on any device: on the CPU under TRITON_INTERPRET=1, which
    tests/conftest.py sets before Triton is imported."""
    return select_ops(torch.device("cpu"), "triton")
