"""The step budget's default (EngineConfig.max_num_batched_tokens None): 8192 on a CUDA device of
>= 70 GiB that is not an A100, as vLLM's server defaults on such GPUs; else 4096. Resolved once
at start; the scheduler, admission and runner all read the resolved value."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from troupe.actors.executor import start_executor
from troupe.config import ConfigError, EngineConfig
from troupe.gpu import runner_setup
from troupe.gpu.runner_setup import is_large_gpu, with_step_budget


def _fake_device(monkeypatch: pytest.MonkeyPatch, name: str, gib: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    props = SimpleNamespace(name=name, total_memory=gib * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)


@pytest.mark.parametrize(
    ("name", "gib", "budget"),
    [("NVIDIA H200", 141, 8192), ("NVIDIA H100 80GB HBM3", 80, 8192),
     ("NVIDIA A100-SXM4-80GB", 80, 4096), ("NVIDIA L4", 24, 4096)],
)  # fmt: skip
def test_default_follows_the_device(
    monkeypatch: pytest.MonkeyPatch, name: str, gib: int, budget: int
) -> None:
    _fake_device(monkeypatch, name, gib)
    config = EngineConfig(device="cuda")
    assert config.max_num_batched_tokens is None
    assert with_step_budget(config).max_num_batched_tokens == budget
    # what the user set is kept
    assert with_step_budget(config.replace(max_num_batched_tokens=2048)).step_budget() == 2048


def test_cpu_and_fake_runners_keep_4096(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_device(monkeypatch, "NVIDIA H200", 141)
    assert not is_large_gpu(EngineConfig(device="cpu"))
    assert not is_large_gpu(EngineConfig(device="cuda", runner="fake"))
    assert EngineConfig().step_budget() == 4096


def test_the_engine_is_built_from_the_resolved_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """start_executor resolves once; the graph's cores read the setup's config."""
    seen: list[EngineConfig] = []

    def build(config: EngineConfig) -> object:
        seen.append(config)
        raise RuntimeError("stop here")

    monkeypatch.setattr(runner_setup, "is_large_gpu", lambda config: True)
    monkeypatch.setattr("troupe.actors.executor.build_runner", build)
    with pytest.raises(RuntimeError, match="stop here"):
        start_executor(EngineConfig(device="cpu"))
    assert seen[0].max_num_batched_tokens == 8192


def test_a_bad_budget_names_the_field() -> None:
    with pytest.raises(ConfigError, match="max_num_batched_tokens must be an integer >= 1"):
        EngineConfig(max_num_batched_tokens=0)
