"""The PDL decode GEMVs (int4 in its f16x2 and integer forms, fp8) compiled for sm_90 on the CPU (ops/gemv_pdl_check.py
reads the PTX): with pdl, only weights are loaded before griddepcontrol.wait (no x, no store),
and a wait moved past the loads is caught; without pdl, no griddepcontrol at all. In a child process:
the offline compile needs the kernels as Triton functions, not the interpreter's."""

from __future__ import annotations

import os
import subprocess
import sys


def test_only_weights_are_read_before_the_wait() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "troupe.ops.gemv_pdl_check"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "PDL CHECK OK" in done.stdout, done.stdout + done.stderr
    assert done.stdout.count("pdl: ok") == 3, done.stdout  # int4 in two forms, fp8
    assert done.stdout.count("the wait moved to the end: rejected") == 3, done.stdout
