"""Test-wide setup. TRITON_INTERPRET must be set before any Triton kernel is defined."""

import os
import sys
from pathlib import Path

import pytest
import torch

# The repo root is the package `troupe`: kernels/, messages/, gpu/ ... are imported as troupe.*.
# As a path entry in front (`python -m pytest` puts the working directory there) the root would
# shadow installed packages of the same names: Hugging Face's `kernels`, which transformers
# >= 5.25 imports, resolved to our kernels/. It goes last instead, where engine processes the
# tests spawn still find `tests.*` (the runner factories they unpickle) and it shadows nothing.
_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT] + [str(_ROOT)]

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """anyio tests run on both backends unless a module overrides this fixture."""
    return str(request.param)
