"""The offline benchmark's engine run (ops/bench_offline.run_engine) as the scripts that reuse
it call it: with their own argparse Namespace (ops/step_timeline.py, ops/deepseek_offline.py),
which carries only the engine's fields; and with each step stamped (`--timed`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from troupe.gpu.weights import qwen3_tiny_config
from troupe.ops import bench_offline


@pytest.mark.parametrize("timed_steps", [False, True])
def test_run_engine_with_a_reusing_scripts_namespace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], timed_steps: bool
) -> None:
    bench_offline.write_model_folder(tmp_path, qwen3_tiny_config())
    args = argparse.Namespace(max_num_seqs=4, max_num_batched_tokens=256, enforce_eager=False)
    prompts = [[5, 6, 7, 8] * 10, [9, 10] * 7, [11] * 3]
    outputs = [6, 3, 9]
    total = bench_offline.run_engine(tmp_path, prompts, outputs, args, timed_steps=timed_steps)
    assert total == sum(outputs)
    printed = capsys.readouterr().out
    assert ("steps by batch:" in printed) is timed_steps
    if timed_steps:  # how many steps prefill depends on when the requests arrive: not asserted
        assert "  prefill: " in printed and "  1-16 seqs: " in printed
