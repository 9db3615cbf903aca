"""n-gram speculation through the whole engine on a tiny random Qwen3: the same greedy tokens
as without it, on the CPU with an overlapping runner (a verification never takes an
overlapped step, and a step after one is planned normally), and on CUDA with CUDA graphs
(decode graphs for plain steps, mixed-step graphs for verifications) and overlap, greedy
and seeded sampling alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.weights import load_model
from troupe.messages import Finished, SamplingParams

from tests.gpu.conftest import add_word_tokenizer

LENGTHS = [5, 23, 9, 17, 30]
SPEC = {"speculative_method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}


@pytest.fixture
def folder(hf_folder: Any, tmp_path: Path) -> Path:
    model, _ = hf_folder("qwen3", max_position_embeddings=128)
    out = tmp_path / "model"
    out.mkdir()
    for file in Path(model).iterdir():
        (out / file.name).write_bytes(file.read_bytes())
    add_word_tokenizer(out)
    return out


async def _run(
    config: EngineConfig, runner: ModelRunner | None = None, temperature: float = 0.0
) -> tuple[Any, Any]:
    results: dict[int, list[Any]] = {}
    async with Engine.open(config, runner=runner) as engine:

        async def one(i: int, n: int) -> None:
            # repeating prompts: the last token often recurs, so proposals are made
            prompt = [(7 * i + j % 5) % 256 for j in range(6 + 3 * i)]
            params = SamplingParams(max_tokens=n, temperature=temperature, seed=i, ignore_eos=True)
            results[i] = await collect(engine, prompt, params)

        async with anyio.create_task_group() as tg:
            for i, n in enumerate(LENGTHS):
                tg.start_soon(one, i, n)
        await wait_blocks_free(engine, timeout=60)
        stats = engine.stats()
    for events in results.values():
        assert isinstance(terminal(events), Finished)
    return [token_ids(results[i]) for i in range(len(LENGTHS))], stats


def _runner(folder: Path, *, overlap: bool, k: int) -> ModelRunner:
    config, model = load_model(folder, torch.float32, torch.device("cpu"), 128)
    options = RunnerOptions(
        block_size=4,
        num_gpu_blocks=64,
        num_cpu_blocks=8,
        max_num_seqs=8,
        max_model_len=128,
        overlap_schedule=overlap,
        num_speculative_tokens=k,
    )
    return ModelRunner(config, model, options)


def test_cpu_overlapping_runner_same_tokens(folder: Path) -> None:
    base = {"device": "cpu", "model": str(folder), "max_model_len": 128, "max_num_seqs": 8}
    plain, _ = anyio.run(_run, EngineConfig(**base), _runner(folder, overlap=False, k=0))
    runner = _runner(folder, overlap=True, k=3)
    spec, stats = anyio.run(_run, EngineConfig(**base, **SPEC), runner)
    assert spec == plain
    assert len({tuple(t) for t in plain}) == len(plain)  # distinct: not degenerate
    assert stats.num_spec_proposed_tokens > 0
    assert runner.statistics().num_overlap_hits > 0  # plain decode steps still overlap


@pytest.mark.gpu
def test_cuda_graphs_and_overlap_same_tokens(folder: Path) -> None:
    base = {
        "device": "cuda",
        "dtype": "float32",
        "model": str(folder),
        "max_model_len": 128,
        "max_num_seqs": 8,
        "num_kv_blocks": 64,
        "block_size": 4,
    }
    plain, _ = anyio.run(_run, EngineConfig(**base))
    spec, stats = anyio.run(_run, EngineConfig(**base, **SPEC))
    assert spec == plain
    assert stats.num_spec_proposed_tokens > 0
    eager, _ = anyio.run(_run, EngineConfig(**base, **SPEC, enforce_eager=True))
    assert eager == plain
    # seeded sampling (the fused Gumbel kernel, keyed by seed and position): the same tokens
    sampled, _ = anyio.run(_run, EngineConfig(**base), None, 0.8)
    sampled_spec, _ = anyio.run(_run, EngineConfig(**base, **SPEC), None, 0.8)
    assert sampled_spec == sampled
