"""Draft-model speculation through the whole engine on tiny random Qwen3 models (CPU, fp32):
the same tokens as without speculation, greedy and seeded, with the target drafting for
itself (nearly every proposal accepted) and with an unrelated random draft (few accepted);
under forced preemption and with prefix caching; every block comes back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from graph_helpers import collect, terminal, token_ids, wait_blocks_free
from troupe import Engine, EngineConfig
from troupe.config import ConfigError
from troupe.messages import Finished, SamplingParams
from troupe.ops.replay import replay_trace

from tests.gpu.conftest import add_word_tokenizer, make_hf_model

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


def _save(tmp_path: Path, name: str, **overrides: Any) -> Path:
    folder = tmp_path / name
    make_hf_model("qwen3", max_position_embeddings=128, **overrides).save_pretrained(folder)
    add_word_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("draft")
    return {
        "target": _save(tmp, "target"),
        # smaller and unrelated: one layer, narrower, other weights
        "small": _save(tmp, "small", seed=1, num_hidden_layers=1, intermediate_size=64),
        "vocab": _save(tmp, "vocab", vocab_size=128),
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


def _draft(models: dict[str, Path], name: str, k: int = 3, **extra: Any) -> EngineConfig:
    settings = {
        **BASE,
        "model": str(models["target"]),
        "speculative_method": "draft_model",
        "draft_model": str(models[name]),
        "num_speculative_tokens": k,
        "speculative_min_acceptance": 0.0,  # no backoff unless asked: every decode verifies
        "speculative_cost_model": False,
        **extra,
    }
    return EngineConfig(**settings)


def _acceptance(stats: Any) -> float:
    assert stats.num_spec_proposed_tokens > 0
    return float(stats.num_spec_accepted_tokens / stats.num_spec_proposed_tokens)


def test_greedy_same_tokens_self_and_unrelated_draft(
    models: dict[str, Path], tmp_path: Path
) -> None:
    plain, _, _ = anyio.run(_run, EngineConfig(**BASE, model=str(models["target"])))
    assert len({tuple(t) for t in plain}) == len(plain)  # distinct: not degenerate
    trace = tmp_path / "draft.trace"
    same, stats, _ = anyio.run(_run, _draft(models, "target", trace_path=str(trace)))
    assert same == plain
    assert _acceptance(stats) > 0.9  # the target proposes what it will verify
    report = replay_trace(trace)  # proposals ride on the recorded StepResults
    assert report.ok, report.divergence and report.divergence.describe()
    other, stats, runner = anyio.run(_run, _draft(models, "small"))
    assert other == plain
    assert _acceptance(stats) < 0.5
    # backoff: per request (the default rate floor) and per step (two running or more)
    backoff, paused, _ = anyio.run(_run, _draft(models, "small", speculative_min_acceptance=0.2))
    assert backoff == plain
    assert 0 < paused.num_spec_proposed_tokens < stats.num_spec_proposed_tokens / 2
    by_size, small_batches, by_size_runner = anyio.run(
        _run, _draft(models, "small", speculative_disable_by_batch_size=2)
    )
    assert by_size == plain
    assert 0 < small_batches.num_spec_proposed_tokens < stats.num_spec_proposed_tokens / 2
    # the draft skips its rounds in those steps too (it proposes only in the last ones)
    assert 0 < by_size_runner.num_draft_rounds < runner.num_draft_rounds / 2
    # the cost model (spec_cost.py): an unrelated draft's proposals soon stop, and so do its
    # rounds (declined proposals pause the request's drafts: gpu/draft_state.py)
    costed, costed_stats, costed_runner = anyio.run(
        _run, _draft(models, "small", speculative_cost_model=True)
    )
    assert costed == plain
    assert costed_stats.num_spec_proposed_tokens < stats.num_spec_proposed_tokens / 2
    assert 0 < costed_runner.num_draft_rounds < runner.num_draft_rounds / 2


def test_seeded_sampling_and_penalties_same_tokens(models: dict[str, Path]) -> None:
    plain, _, _ = anyio.run(
        _run, EngineConfig(**BASE, model=str(models["target"])), 0.8, False, 0.5
    )
    same, stats, _ = anyio.run(_run, _draft(models, "target"), 0.8, False, 0.5)
    assert same == plain
    # the draft draws with the target's noise and penalties at each position: the same draws
    assert _acceptance(stats) > 0.9
    other, _, _ = anyio.run(_run, _draft(models, "small"), 0.8, False, 0.5)
    assert other == plain


def test_preemption_and_prefix_cache_same_tokens(models: dict[str, Path]) -> None:
    tight = {"num_kv_blocks": 20, "num_cpu_blocks": 8}
    plain_config = EngineConfig(**BASE, model=str(models["target"]))
    plain, _, _ = anyio.run(_run, plain_config, 0.0, True, 0.0, LONG)
    same, stats, _ = anyio.run(_run, _draft(models, "target", **tight), 0.0, True, 0.0, LONG)
    assert same == plain
    assert stats.num_preemptions_swap > 0
    assert stats.prefix_cache_hit_tokens > 0
    assert _acceptance(stats) > 0.5
    recompute, stats, _ = anyio.run(
        _run, _draft(models, "small", **tight, preemption_mode="recompute"), 0.0, True, 0.0, LONG
    )
    assert recompute == plain
    assert stats.num_preemptions_recompute > 0


def test_vocab_mismatch_names_both_sizes(models: dict[str, Path]) -> None:
    async def start() -> None:
        async with Engine.open(_draft(models, "vocab")):
            pass

    with pytest.raises(ConfigError, match="128 tokens, the model has 256"):
        anyio.run(start)


@pytest.mark.gpu
def test_cuda_graphs_same_tokens(models: dict[str, Path]) -> None:
    cuda = {"device": "cuda"}
    plain, _, _ = anyio.run(_run, EngineConfig(**{**BASE, **cuda}, model=str(models["target"])))
    same, stats, _ = anyio.run(_run, _draft(models, "target", **cuda))
    assert same == plain
    assert _acceptance(stats) > 0.9
    other, _, _ = anyio.run(_run, _draft(models, "small", **cuda))
    assert other == plain
    eager, _, _ = anyio.run(_run, _draft(models, "small", **cuda, enforce_eager=True))
    assert eager == plain
    sampled, _, _ = anyio.run(
        _run, EngineConfig(**{**BASE, **cuda}, model=str(models["target"])), 0.8
    )
    sampled_spec, stats, _ = anyio.run(_run, _draft(models, "target", **cuda), 0.8)
    assert sampled_spec == sampled
    assert _acceptance(stats) > 0.8


@pytest.mark.gpu
def test_cuda_draft_graphs_swap_and_bf16(models: dict[str, Path]) -> None:
    from troupe.gpu.model_runner import ModelRunner

    runner = ModelRunner.from_config(_draft(models, "small", device="cuda"))
    draft = runner._draft
    assert draft is not None and draft._pass.graphs is not None and draft._pass.mixed is not None
    assert runner.num_lookahead_tokens == 3 and not runner.overlap_schedule
    runner.close()
    cuda = {"device": "cuda", "num_kv_blocks": 20, "num_cpu_blocks": 8}
    plain_config = EngineConfig(**{**BASE, "device": "cuda"}, model=str(models["target"]))
    plain, _, _ = anyio.run(_run, plain_config, 0.0, True, 0.0, LONG)
    same, stats, runner_stats = anyio.run(
        _run, _draft(models, "target", **cuda), 0.0, True, 0.0, LONG
    )
    assert same == plain
    assert stats.num_preemptions_swap > 0  # the draft's blocks went to its pinned pool too
    assert _acceptance(stats) > 0.9
    assert runner_stats.num_draft_rounds > 0 and runner_stats.num_draft_tokens > 0
    # bf16: a one-token draft step and the target's (k+1)-token verification round
    # differently, so near-ties may flip a proposal (and, as for n-gram speculation in bf16,
    # an output: only fp32 promises identical tokens); acceptance stays high
    bf16 = {"device": "cuda", "dtype": "bfloat16"}
    _, stats, _ = anyio.run(_run, _draft(models, "target", **bf16))
    assert _acceptance(stats) > 0.7
