"""Overlap scheduling through the whole engine, and its switch: an engine driving an
overlapping runner streams the same tokens as one driving a plain runner (the scheduler keeps
the lookahead slot, so most decode steps are taken from the early launch), and
EngineConfig.enable_overlap_schedule decides it on CUDA; from a config, a CPU runner never
overlaps. The runner-level cases are in test_overlap_step.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.config import ConfigError
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import load_model
from troupe.messages import Finished, SamplingParams

from tests.gpu.conftest import add_word_tokenizer


@pytest.fixture
def qwen3(hf_folder: Any) -> Path:
    folder, _ = hf_folder("qwen3", max_position_embeddings=128)
    return Path(folder)


async def _run_engine(config: EngineConfig, runner: ModelRunner) -> tuple[list[list[int]], Any]:
    lengths = [3, 17, 6, 11, 1]
    results: dict[int, list[Any]] = {}
    async with Engine.open(config, runner=runner) as engine:

        async def one(i: int, n: int) -> None:
            prompt = [(17 * i + 5 * j + 1) % 256 for j in range(4 + 3 * i)]
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            results[i] = await collect(engine, prompt, params)

        async with anyio.create_task_group() as tg:
            for i, n in enumerate(lengths):
                tg.start_soon(one, i, n)
        await wait_blocks_free(engine, timeout=60)
        stats = engine.stats()
        assert engine.runner_stats() == runner.statistics()
    for events in results.values():
        assert isinstance(terminal(events), Finished)
    tokens = [token_ids(results[i]) for i in range(len(lengths))]
    assert [len(t) for t in tokens] == lengths
    return tokens, stats


def _engine_runner(folder: Path, *, overlap: bool) -> ModelRunner:
    """The runner an EngineConfig of this test describes, with overlap chosen by the test (from
    a config, a CPU runner never overlaps)."""
    config, model = load_model(folder, torch.float32, torch.device("cpu"), 128)
    options = RunnerOptions(
        block_size=4,
        num_gpu_blocks=48,
        num_cpu_blocks=8,
        max_num_seqs=4,
        max_model_len=128,
        overlap_schedule=overlap,
    )
    return ModelRunner(config, model, options)


def test_engine_same_tokens_with_overlap(qwen3: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for file in qwen3.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    add_word_tokenizer(folder)
    config = EngineConfig(device="cpu", model=str(folder), max_model_len=128, max_num_seqs=4)
    plain_runner = _engine_runner(folder, overlap=False)
    plain, plain_stats = anyio.run(_run_engine, config, plain_runner)
    over_runner = _engine_runner(folder, overlap=True)
    over, over_stats = anyio.run(_run_engine, config, over_runner)
    assert over == plain
    assert over_stats.num_gpu_blocks_used == 0 and plain_stats.num_gpu_blocks_used == 0
    assert len({tuple(t) for t in plain}) == len(plain)  # distinct outputs: not degenerate
    assert plain_runner.statistics().num_overlapped == 0
    # the scheduler got the lookahead: most decode steps were taken from the early launch
    stats = over_runner.statistics()
    assert stats.num_overlap_hits >= 8
    assert stats.num_overlapped >= stats.num_overlap_hits


def test_cpu_runner_from_config_never_overlaps(qwen3: Path) -> None:
    config = EngineConfig(device="cpu", model=str(qwen3), num_kv_blocks=16, num_cpu_blocks=0)
    runner = ModelRunner.from_config(config)
    assert runner.num_lookahead_tokens == 0 and not runner.overlap_schedule


@pytest.mark.gpu
@pytest.mark.parametrize("enabled", [True, False])
def test_cuda_runner_follows_the_config(qwen3: Path, enabled: bool) -> None:
    config = EngineConfig(
        device="cuda",
        model=str(qwen3),
        num_kv_blocks=16,
        num_cpu_blocks=0,
        enable_overlap_schedule=enabled,
    )
    runner = ModelRunner.from_config(config)
    assert runner.num_lookahead_tokens == int(enabled)


def test_bad_config_value_names_the_field() -> None:
    with pytest.raises(ConfigError, match="enable_overlap_schedule"):
        EngineConfig(enable_overlap_schedule="yes")  # type: ignore[arg-type]
