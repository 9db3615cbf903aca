"""Test-wide setup. TRITON_INTERPRET must be set before any Triton kernel is defined."""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "0" if os.environ.get("TROUPE_GPU_TESTS") else "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
