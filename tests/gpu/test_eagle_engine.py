"""EAGLE-1 speculation (speculative_method="eagle") through the whole engine on tiny random
Qwen3 models (CPU, fp32): the same tokens as without speculation, greedy and seeded, with
prefill chunks, under preemption (swap and recompute) and prefix caching; a head that
reproduces the target is accepted every time, an untrained one rarely; every block comes
back. The GPU test does the same with CUDA graphs (the target's hidden rows read after a
replay)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.messages import Finished, SamplingParams

from tests.gpu.conftest import add_word_tokenizer, make_hf_model
from tests.gpu.eagle_heads import copy_head, random_head

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
# attention over the last 4 tokens: the head's row at p (tokens p-2 .. p+1) sees what the
# target's row at p + 1 sees, so a copy of its layer reproduces it exactly (eagle_heads.py)
WINDOW = {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}


def _save(folder: Path, **overrides: Any) -> Path:
    make_hf_model(
        "qwen3", max_position_embeddings=128, num_hidden_layers=1, **overrides
    ).save_pretrained(folder)
    add_word_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("eagle")
    target, windowed = _save(tmp / "target"), _save(tmp / "windowed", **WINDOW)
    return {
        "target": target,
        "windowed": windowed,
        "copy": copy_head(tmp / "copy", windowed),
        "random": random_head(tmp / "random", target, fc_bias=True),
        "random_embed": random_head(tmp / "random_embed", target, seed=4, embed=True),
    }


async def _run(
    config: EngineConfig,
    temperature: float = 0.0,
    shared: bool = False,
    penalty: float = 0.0,
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
                frequency_penalty=penalty * (i % 2),  # penalties read the draws' history
                repetition_penalty=1.0 + penalty * (i % 2),
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


def _plain(models: dict[str, Path], target: str = "target", **extra: Any) -> EngineConfig:
    return EngineConfig(**{**BASE, **extra}, model=str(models[target]))


def _eagle(
    models: dict[str, Path], head: str, target: str = "target", k: int = 3, **extra: Any
) -> EngineConfig:
    settings = {
        **BASE,
        "model": str(models[target]),
        "speculative_method": "eagle",
        "draft_model": str(models[head]),
        "num_speculative_tokens": k,
        "speculative_min_acceptance": 0.0,  # no backoff unless asked: every decode verifies
        "speculative_cost_model": False,
        **extra,
    }
    return EngineConfig(**settings)


def _acceptance(stats: Any) -> float:
    assert stats.num_spec_proposed_tokens > 0
    return float(stats.num_spec_accepted_tokens / stats.num_spec_proposed_tokens)


def test_copy_head_accepted_random_head_not(models: dict[str, Path]) -> None:
    plain, _, _ = anyio.run(_run, _plain(models, "windowed"))
    assert len({tuple(t) for t in plain}) == len(plain)  # distinct: not degenerate
    same, stats, runner = anyio.run(_run, _eagle(models, "copy", "windowed"))
    assert same == plain
    assert _acceptance(stats) == 1.0  # the head computes what the target will
    assert runner.num_draft_rounds > 0 and runner.num_draft_tokens > 0
    # chunked prefill: the row at each chunk's end waits for the next chunk's first token
    chunked, stats, _ = anyio.run(
        _run, _eagle(models, "copy", "windowed", max_num_batched_tokens=8), 0.8
    )
    assert chunked == anyio.run(_run, _plain(models, "windowed", max_num_batched_tokens=8), 0.8)[0]
    assert _acceptance(stats) == 1.0  # sampled too: the head draws with the target's noise
    plain, _, _ = anyio.run(_run, _plain(models))
    other, stats, _ = anyio.run(_run, _eagle(models, "random"))
    assert other == plain
    assert _acceptance(stats) < 0.3
    own_embedding, _, _ = anyio.run(_run, _eagle(models, "random_embed", k=2))
    assert own_embedding == plain


def test_seeded_sampling_penalties_and_chunks_same_tokens(models: dict[str, Path]) -> None:
    chunks = {"max_num_batched_tokens": 8}
    plain, _, _ = anyio.run(_run, _plain(models, **chunks), 0.8, False, 0.5)
    same, stats, _ = anyio.run(_run, _eagle(models, "random", **chunks), 0.8, False, 0.5)
    assert same == plain
    assert stats.num_spec_proposed_tokens > 0


def test_preemption_and_prefix_cache_same_tokens(models: dict[str, Path]) -> None:
    # prefix caching with the windowed target (its released blocks keep the pool roomy)
    plain, _, _ = anyio.run(_run, _plain(models, "windowed"), 0.0, True, 0.0, LONG)
    same, stats, _ = anyio.run(_run, _eagle(models, "copy", "windowed"), 0.0, True, 0.0, LONG)
    assert same == plain
    assert stats.prefix_cache_hit_tokens > 0
    assert _acceptance(stats) > 0.9  # rows of cached blocks: the head's, from their request
    tight = {"num_kv_blocks": 20, "num_cpu_blocks": 8}
    plain, _, _ = anyio.run(_run, _plain(models), 0.0, True, 0.0, LONG)
    swapped, stats, _ = anyio.run(_run, _eagle(models, "random", **tight), 0.0, True, 0.0, LONG)
    assert swapped == plain
    assert stats.num_preemptions_swap > 0  # the head's blocks went to its CPU pool and back
    recompute, stats, _ = anyio.run(
        _run,
        _eagle(models, "random", **tight, preemption_mode="recompute"),
        0.0,
        True,
        0.0,
        LONG,
    )
    assert recompute == plain
    assert stats.num_preemptions_recompute > 0


@pytest.mark.gpu
def test_cuda_graphs_same_tokens_and_copy_head_accepted(models: dict[str, Path]) -> None:
    from troupe.gpu.model_runner import ModelRunner

    cuda = {"device": "cuda"}
    runner = ModelRunner.from_config(_eagle(models, "copy", "windowed", **cuda))
    assert runner._pass.graphs is not None and runner._pass.mixed is not None  # graphs in use
    assert runner.num_lookahead_tokens == 3 and not runner.overlap_schedule
    runner.close()
    for temperature in (0.0, 0.8):
        plain, _, _ = anyio.run(_run, _plain(models, "windowed", **cuda), temperature)
        same, stats, _ = anyio.run(_run, _eagle(models, "copy", "windowed", **cuda), temperature)
        assert same == plain
        assert _acceptance(stats) > 0.95  # hidden rows read after decode and mixed replays
    plain, _, _ = anyio.run(_run, _plain(models, **cuda))
    other, stats, _ = anyio.run(_run, _eagle(models, "random", **cuda))
    assert other == plain
    assert _acceptance(stats) < 0.3
    eager, _, _ = anyio.run(_run, _eagle(models, "random", **cuda, enforce_eager=True))
    assert eager == plain
    # swap on CUDA: the head's blocks go to its pinned pool and back
    tight = {"device": "cuda", "num_kv_blocks": 20, "num_cpu_blocks": 8}
    plain, _, _ = anyio.run(_run, _plain(models, **cuda), 0.0, True, 0.0, LONG)
    swapped, stats, _ = anyio.run(_run, _eagle(models, "random", **tight), 0.0, True, 0.0, LONG)
    assert swapped == plain
    assert stats.num_preemptions_swap > 0
    # bf16: acceptance stays high (a one-row draft step and the (k+1)-row verification round
    # differently, so near-ties may flip a proposal: only fp32 promises identical tokens)
    bf16 = {"device": "cuda", "dtype": "bfloat16"}
    _, stats, _ = anyio.run(_run, _eagle(models, "copy", "windowed", **bf16))
    assert _acceptance(stats) > 0.7
