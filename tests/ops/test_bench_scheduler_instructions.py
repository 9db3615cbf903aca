"""The instruction-count benchmark's step filter: outside valgrind its toggles do nothing, and it
counts exactly the decode steps asked for (after the warm ones)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from troupe.ops.bench_scheduler_instructions import build_library, count_steps

needs_tools = pytest.mark.skipif(
    shutil.which("cc") is None or not Path("/usr/include/valgrind/callgrind.h").exists(),
    reason="needs a C compiler and valgrind's headers",
)


@needs_tools
def test_counts_the_decode_steps_asked_for(tmp_path: Path) -> None:
    library = build_library(tmp_path)
    assert count_steps(library, num_seqs=8, num_steps=5) == 5
