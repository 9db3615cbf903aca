"""MTP speculation (speculative_method="mtp", the model's own multi-token-prediction layer)
through the whole engine on tiny random DeepSeek-V3 models (CPU, fp32): the same tokens as
without speculation, greedy and seeded, with prefill chunks, under swap preemption and prefix
caching; proposals are made and counted; an MTP layer built to reproduce the model is
accepted every time, greedy and sampled; every block comes back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.messages import Finished, SamplingParams

from tests.gpu.mtp_checkpoints import bigram_copy, save_model
from tests.gpu.test_eagle_engine import _acceptance

LENGTHS = (4, 14, 7, 11)
LONG = (24, 30, 20, 28)  # outgrow a pool of 20 blocks of 4 together: preemption
BASE: dict[str, Any] = {
    "device": "cpu",
    "dtype": "float32",
    "max_model_len": 128,
    "max_num_seqs": 8,
    "block_size": 4,
    "num_kv_blocks": 96,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("mtp")
    return {"random": save_model(tmp / "random"), "copy": bigram_copy(tmp / "copy")}


async def _run(
    config: EngineConfig,
    temperature: float = 0.0,
    shared: bool = False,
    lengths: tuple[int, ...] = LENGTHS,
) -> Any:
    results: dict[int, list[Any]] = {}
    async with Engine.open(config) as engine:

        async def one(i: int, n: int) -> None:
            head = [11, 12, 13, 14, 15, 16, 17, 18] if shared else []  # two cached blocks
            prompt = head + [(7 * i + j % 5) % 256 for j in range(6 + 3 * i)]
            params = SamplingParams(
                max_tokens=n,
                temperature=temperature,
                seed=i,
                ignore_eos=True,
                frequency_penalty=0.5 * (i % 2),  # penalties read the draws' history
                logprobs=2 if i == 1 else None,
            )
            results[i] = await collect(engine, prompt, params)

        async with anyio.create_task_group() as tg:
            for i, n in enumerate(lengths):
                tg.start_soon(one, i, n)
        await wait_blocks_free(engine, timeout=60)
        stats = engine.stats()
        runner = engine.runner_stats()
    for events in results.values():
        assert isinstance(terminal(events), Finished)
    return [token_ids(results[i]) for i in range(len(lengths))], stats, runner


def _plain(model: Path, **extra: Any) -> EngineConfig:
    return EngineConfig(**{**BASE, **extra}, model=str(model))


def _mtp(model: Path, k: int = 3, method: str = "mtp", **extra: Any) -> EngineConfig:
    settings = {
        **BASE,
        "model": str(model),
        "speculative_method": method,
        "num_speculative_tokens": k,
        "speculative_min_acceptance": 0.0,  # no backoff unless asked: every decode verifies
        "speculative_cost_model": False,
        **extra,
    }
    return EngineConfig(**settings)


def test_copy_layer_accepted_every_time(models: dict[str, Path]) -> None:
    copy = models["copy"]
    plain, _, _ = anyio.run(_run, _plain(copy))
    assert len({tuple(t) for t in plain}) > 1  # not one degenerate stream
    same, stats, runner = anyio.run(_run, _mtp(copy, method="deepseek_mtp"))
    assert same == plain
    assert _acceptance(stats) == 1.0  # the layer computes what the model will
    assert runner.num_draft_rounds > 0 and runner.num_draft_tokens > 0
    # sampled, with prefill chunks: the layer draws with the model's noise
    chunks = {"max_num_batched_tokens": 8}
    sampled, stats, _ = anyio.run(_run, _mtp(copy, **chunks), 0.8)
    assert sampled == anyio.run(_run, _plain(copy, **chunks), 0.8)[0]
    assert _acceptance(stats) == 1.0


def test_random_layer_same_tokens_greedy_and_seeded(models: dict[str, Path]) -> None:
    model = models["random"]
    plain, _, _ = anyio.run(_run, _plain(model))
    assert len({tuple(t) for t in plain}) == len(plain)  # distinct: not degenerate
    same, stats, runner = anyio.run(_run, _mtp(model))
    assert same == plain
    assert stats.num_spec_proposed_tokens > 0 and runner.num_draft_tokens > 0
    assert _acceptance(stats) < 0.5  # untrained: the target's own tokens carry the output
    chunks = {"max_num_batched_tokens": 8}
    seeded, stats, _ = anyio.run(_run, _mtp(model, k=2, **chunks), 0.8)
    assert seeded == anyio.run(_run, _plain(model, **chunks), 0.8)[0]
    assert stats.num_spec_proposed_tokens > 0


def test_swap_preemption_and_prefix_cache_same_tokens(models: dict[str, Path]) -> None:
    copy = models["copy"]
    plain, _, _ = anyio.run(_run, _plain(copy), 0.0, True, LONG)
    same, stats, _ = anyio.run(_run, _mtp(copy), 0.0, True, LONG)
    assert same == plain
    assert stats.prefix_cache_hit_tokens > 0
    assert _acceptance(stats) == 1.0
    tight = {"num_kv_blocks": 20, "num_cpu_blocks": 8}
    model = models["random"]
    plain, _, _ = anyio.run(_run, _plain(model, **tight), 0.0, True, LONG)
    swapped, stats, _ = anyio.run(_run, _mtp(model, **tight), 0.0, True, LONG)
    assert swapped == plain
    assert stats.num_preemptions_swap > 0  # the layer's blocks went to its CPU pool and back


@pytest.mark.gpu
def test_cuda_graphs_same_tokens_and_copy_layer_accepted(models: dict[str, Path]) -> None:
    from troupe.gpu.model_runner import ModelRunner

    cuda = {"device": "cuda"}
    copy, model = models["copy"], models["random"]
    runner = ModelRunner.from_config(_mtp(copy, **cuda))
    assert runner._pass.graphs is not None and runner._pass.mixed is not None  # graphs in use
    assert runner.num_lookahead_tokens == 3 and not runner.overlap_schedule
    runner.close()
    for temperature in (0.0, 0.8):
        plain, _, _ = anyio.run(_run, _plain(copy, **cuda), temperature)
        same, stats, _ = anyio.run(_run, _mtp(copy, **cuda), temperature)
        assert same == plain
        assert _acceptance(stats) > 0.95  # hidden rows read after decode and mixed replays
    plain, _, _ = anyio.run(_run, _plain(model, **cuda))
    other, stats, _ = anyio.run(_run, _mtp(model, **cuda))
    assert other == plain
    assert stats.num_spec_proposed_tokens > 0
    tight = {"device": "cuda", "num_kv_blocks": 20, "num_cpu_blocks": 8}
    plain, _, _ = anyio.run(_run, _plain(model, **tight), 0.0, True, LONG)
    swapped, stats, _ = anyio.run(_run, _mtp(model, **tight), 0.0, True, LONG)
    assert swapped == plain
    assert stats.num_preemptions_swap > 0  # the layer's blocks to its pinned pool and back
    # bf16: acceptance stays high (near-ties may flip: only fp32 promises identical tokens)
    _, stats, _ = anyio.run(_run, _mtp(copy, device="cuda", dtype="bfloat16"))
    assert _acceptance(stats) > 0.7
