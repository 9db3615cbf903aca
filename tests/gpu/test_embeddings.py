"""Embeddings (SamplingParams.pooling) through the whole engine on a tiny random Qwen3 against
transformers' final hidden states: last-token, mean and first-token pooling, normalized or
not, over chunked prompts beside decoding requests on an overlapping runner; a repeated prompt
pooled by its last token keeps its prefix-cache hit, one pooled by its mean is computed whole;
under recompute preemption; and the CUDA test's interleaved workload on the CPU (a prompt's
last token computed alone, planned like a decode)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from graph_helpers import collect, terminal, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.gpu.model_runner import ModelRunner
from troupe.messages import Delta, Finished, Pooling, SamplingParams, StreamEvent

from tests.gpu.tiny_qwen3 import cuda_config, overlapping_runner, recompute_config, tiny_folder

PROMPTS = [[(13 * i + 5 * j + j * j) % 256 for j in range(7 + 8 * i)] for i in range(4)]
POOLINGS = [
    Pooling(),
    Pooling(type="mean"),
    Pooling(type="cls", normalize=False),
    Pooling(type="mean", normalize=False),
]


@pytest.fixture
def tiny(hf_folder: Any, tmp_path: Path) -> tuple[Path, Any]:
    return tiny_folder(hf_folder, tmp_path)


def _expected(hf_model: Any, prompt: list[int], pooling: Pooling) -> torch.Tensor:
    with torch.no_grad():
        hidden = hf_model.model(torch.tensor([prompt])).last_hidden_state[0]
    vector = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[pooling.type]
    return torch.nn.functional.normalize(vector, dim=0) if pooling.normalize else vector


def _first(events: list[StreamEvent]) -> Delta | Finished:
    first = events[0]
    assert isinstance(first, Delta | Finished)
    assert all(e.embedding is None for e in events[1:] if isinstance(e, Delta | Finished))
    return first


def _check(
    events: list[StreamEvent], hf_model: Any, prompt: list[int], pooling: Pooling, tol: float = 1e-4
) -> None:
    assert isinstance(terminal(events), Finished)
    got = _first(events).embedding
    assert got is not None
    expected = _expected(hf_model, prompt, pooling)
    assert len(got) == len(expected)
    assert torch.tensor(got) == pytest.approx(expected, abs=tol)


def test_embeddings_equal_transformers(tiny: tuple[Path, Any]) -> None:
    folder, hf_model = tiny
    config = EngineConfig(
        device="cpu",
        model=str(folder),
        max_model_len=128,
        max_num_seqs=8,
        max_num_batched_tokens=12,  # prompts of 7-31 tokens come in chunks
        enable_prefix_caching=True,
    )
    results: dict[str, list[StreamEvent]] = {}

    async def main() -> None:
        async with Engine.open(config, runner=overlapping_runner(folder)) as engine:

            async def one(name: str, prompt: list[int], params: SamplingParams) -> None:
                results[name] = await collect(engine, prompt, params)

            decode = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
            async with anyio.create_task_group() as tg:
                for i, prompt in enumerate(PROMPTS):
                    tg.start_soon(one, f"plain{i}", prompt[::-1], decode)
                for i, prompt in enumerate(PROMPTS):
                    params = SamplingParams(max_tokens=1 + i, pooling=POOLINGS[i], ignore_eos=True)
                    tg.start_soon(one, f"pooled{i}", prompt, params)
            for i in (0, 1):  # twice in a row: the second finds the first's blocks cached
                params = SamplingParams(max_tokens=1, pooling=POOLINGS[i])
                await collect(engine, PROMPTS[i], params)
                results[f"again{i}"] = await collect(engine, PROMPTS[i], params)
            await wait_blocks_free(engine, timeout=60)

    anyio.run(main)
    for i, prompt in enumerate(PROMPTS):
        _check(results[f"pooled{i}"], hf_model, prompt, POOLINGS[i])
        assert _first(results[f"plain{i}"]).embedding is None
    for i in (0, 1):
        _check(results[f"again{i}"], hf_model, PROMPTS[i], POOLINGS[i])
    last, mean = terminal(results["again0"]), terminal(results["again1"])
    assert isinstance(last, Finished) and last.usage.cached_tokens > 0  # the hit is kept
    assert isinstance(mean, Finished) and mean.usage.cached_tokens == 0  # every position pooled


def test_mean_pooling_survives_recompute_preemption(tiny: tuple[Path, Any]) -> None:
    folder, hf_model = tiny
    config = recompute_config(folder)
    prompts = [p[:16] for p in PROMPTS]
    pooling = Pooling(type="mean")
    results: dict[int, list[StreamEvent]] = {}

    async def main() -> int:
        async with Engine.open(config) as engine:

            async def one(i: int) -> None:
                params = SamplingParams(max_tokens=12, ignore_eos=True, pooling=pooling)
                results[i] = await collect(engine, prompts[i], params)

            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            await wait_blocks_free(engine, timeout=60)
            return engine.stats().num_preemptions_recompute

    assert anyio.run(main) > 0
    for i, prompt in enumerate(prompts):
        _check(results[i], hf_model, prompt, pooling)


def _interleaved(config: EngineConfig, runner: ModelRunner | None) -> dict[int, list[StreamEvent]]:
    """Each pooled prompt submitted right after a decoding neighbour (events by request: the
    pooled i, the neighbour 10 + i)."""
    results: dict[int, list[StreamEvent]] = {}

    async def main() -> None:
        async with Engine.open(config, runner=runner) as engine:

            async def one(i: int, prompt: list[int], params: SamplingParams) -> None:
                results[i] = await collect(engine, prompt, params)

            decode = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
            async with anyio.create_task_group() as tg:
                for i, prompt in enumerate(PROMPTS):
                    tg.start_soon(one, 10 + i, prompt[::-1], decode)
                    params = SamplingParams(max_tokens=2, pooling=POOLINGS[i], ignore_eos=True)
                    tg.start_soon(one, i, prompt, params)
            await wait_blocks_free(engine, timeout=60)

    anyio.run(main)
    return results


@pytest.mark.parametrize("overlapping", [False, True])
def test_embeddings_of_the_cuda_workload_on_the_cpu(
    tiny: tuple[Path, Any], overlapping: bool
) -> None:
    """The CUDA test's workload: the mean-pooled prompt of 15 tokens comes in chunks of 4 and
    10 beside decodes, its last token alone as if it were a decode, and must still be pooled."""
    folder, hf_model = tiny
    config = dataclasses.replace(cuda_config(folder), device="cpu")
    results = _interleaved(config, overlapping_runner(folder) if overlapping else None)
    for i, prompt in enumerate(PROMPTS):
        _check(results[i], hf_model, prompt, POOLINGS[i])
        assert _first(results[10 + i]).embedding is None


@pytest.mark.gpu
def test_embeddings_on_cuda_with_graphs_and_overlap(tiny: tuple[Path, Any]) -> None:
    folder, hf_model = tiny
    results = _interleaved(cuda_config(folder), None)
    for i, prompt in enumerate(PROMPTS):
        _check(results[i], hf_model, prompt, POOLINGS[i], tol=2e-3)
