"""release_freed_heap runs malloc_trim and map_large_blocks mallopt where libc is glibc (this
project's Linux machines)."""

from __future__ import annotations

import platform

import pytest
from troupe.gpu.heap_trim import map_large_blocks, release_freed_heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_runs_on_glibc() -> None:
    assert release_freed_heap() is True


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_large_block_threshold_is_set_on_glibc() -> None:
    assert map_large_blocks() is True
