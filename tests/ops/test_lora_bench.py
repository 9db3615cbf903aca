"""ops/lora_bench.py: its random adapters fit the model they are made for (the runner's own
check accepts them), and every scenario runs through a real engine graph (the fake runner),
under each LoRA form asked for."""

from __future__ import annotations

from pathlib import Path

import pytest
from troupe.config import resolve_model_path
from troupe.gpu.lora_adapter import TARGET_MODULES, load_adapter
from troupe.gpu.weights import read_config
from troupe.ops.lora_bench import main, write_adapters


def test_the_adapters_fit_the_default_model(tmp_path: Path) -> None:
    entries = write_adapters(None, tmp_path, 2, 4)
    config = read_config(resolve_model_path(None))
    for entry in entries:
        name, path = entry.split("=", 1)
        adapter = load_adapter(name, path, config, max_rank=4)
        assert adapter.rank == 4
        assert {module for _, module in adapter.weights} == set(TARGET_MODULES)
        assert len(adapter.weights) == config.num_layers * len(TARGET_MODULES)


def test_every_scenario_runs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--runner", "fake", "--num-requests", "4", "--prompt-len", "8", "--max-tokens", "4"]
    argv += ["--num-adapters", "2", "--rank", "4", "--repeats", "1"]
    argv += ["--lora-kernel", "masked", "punica"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["no adapters loaded"] + [
        f"[{kernel}] {label}"
        for kernel in ("masked", "punica")
        for label in (
            "adapters loaded, none used",
            "one adapter",
            "2 adapters",
            "2 adapters, 1 slots",
        )
    ]
    assert lines[0].endswith("1.00x") and all("tok/s" in line for line in lines)
