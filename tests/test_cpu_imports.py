"""A CPU engine runs no kernel, so it never imports Triton (~72 MiB of RSS and ~80 ms of start
on the 2-core machine: issue 16's peak RSS <= 600 MiB had crept to 595-601 with it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
import anyio
from troupe import Engine, EngineConfig, SamplingParams

async def main():
    async with Engine.open(EngineConfig(device="cpu")) as engine:  # the default model, 4-bit
        async for _ in engine.generate([1, 2, 3], SamplingParams(max_tokens=2)):
            pass

anyio.run(main)
print(sorted(m for m in sys.modules if m == "triton" or m.startswith("triton.")))
"""


def test_a_cpu_engine_never_imports_triton(tmp_path: Path) -> None:
    # a fresh interpreter (this one has imported Triton for the kernel tests), outside the repo
    # root, which is the package itself
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
