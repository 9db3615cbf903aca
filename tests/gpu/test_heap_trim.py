"""release_freed_heap runs malloc_trim where libc is glibc (this project's Linux machines)."""

from __future__ import annotations

import platform

import pytest
from troupe.gpu.heap_trim import release_freed_heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_runs_on_glibc() -> None:
    assert release_freed_heap() is True
