"""EAGLE-3 speculation through the whole engine on tiny random models (CPU, fp32): the same
tokens as without speculation, greedy and seeded (with penalties and prefill chunks), with a
full and with a smaller draft vocabulary (d2t), under swap preemption, with heads narrower
and wider than the model (target_hidden_size, their own embedding); a head built to
reproduce the target is accepted every time, an untrained one rarely (so is it as the
speculators library saves it, and saved without lm_head.weight); every block comes back.
The GPU test does the same with CUDA graphs (the target's tapped layers read after a replay)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from troupe import EngineConfig

from tests.gpu.conftest import add_word_tokenizer, make_hf_model
from tests.gpu.eagle3_heads import copy_head3, random_head3, unit_rms_embeddings
from tests.gpu.eagle_heads import save_head, target_tensors
from tests.gpu.eagle_speculators_heads import speculators_head3
from tests.gpu.test_eagle_engine import BASE, LONG, _acceptance, _run

# the copy head's target: one windowed layer (the head's row at p sees what the target's row
# at p + 1 sees), KV heads spanning the hidden size, embedding rows of RMS 1 (eagle3_heads.py)
COPYABLE = {
    "use_sliding_window": True,
    "sliding_window": 4,
    "max_window_layers": 0,
    "num_hidden_layers": 1,
    "num_key_value_heads": 4,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("eagle3")
    target = tmp / "target"  # three layers: vLLM's default taps (2, 1, 0) are distinct
    make_hf_model("qwen3", max_position_embeddings=128, num_hidden_layers=3).save_pretrained(target)
    add_word_tokenizer(target)
    copyable = make_hf_model("qwen2", max_position_embeddings=128, **COPYABLE)
    unit_rms_embeddings(copyable)
    copyable.save_pretrained(tmp / "copyable")
    add_word_tokenizer(tmp / "copyable")
    copy = copy_head3(tmp / "copy", tmp / "copyable")
    no_lm_head = {k: v for k, v in target_tensors(copy).items() if k != "lm_head.weight"}
    cfg = json.loads((copy / "config.json").read_text())
    return {
        "target": target,
        "copyable": tmp / "copyable",
        "copy": copy,
        # the copy head as the speculators library saves it, proposing 2 tokens
        "copy_spec": speculators_head3(tmp / "copy_spec", copy, k=2),
        # without lm_head.weight: the model's (tied to its embedding) makes the logits
        "copy_shared": save_head(tmp / "copy_shared", copy, no_lm_head, **cfg),
        "copy_spec_shared": speculators_head3(
            tmp / "copy_spec_shared", copy, k=2, drop=("lm_head.weight",)
        ),
        "random": random_head3(tmp / "random", target),
        "small_vocab": random_head3(tmp / "small_vocab", target, seed=4, draft_vocab=96),
        "own_embed": random_head3(tmp / "own_embed", target, seed=5, embed=True),
        # the target is 64 wide: fc [32 | 128, 3 * 64], their own embeddings
        "narrow": random_head3(tmp / "narrow", target, seed=6, hidden_size=32, embed=True),
        "wide": random_head3(
            tmp / "wide", target, seed=7, draft_vocab=96, hidden_size=128, embed=True
        ),
    }


def _plain(models: dict[str, Path], target: str = "target", **extra: Any) -> EngineConfig:
    return EngineConfig(**{**BASE, **extra}, model=str(models[target]))


def _eagle3(
    models: dict[str, Path], head: str, target: str = "target", k: int | None = 3, **extra: Any
) -> EngineConfig:
    settings = {
        **BASE,
        "model": str(models[target]),
        "speculative_method": "eagle3",
        "draft_model": str(models[head]),
        "num_speculative_tokens": k,
        "speculative_min_acceptance": 0.0,  # no backoff: every decode verifies
        "speculative_cost_model": False,
        **extra,
    }
    return EngineConfig(**settings)


def test_copy_head_accepted(models: dict[str, Path]) -> None:
    plain, _, _ = anyio.run(_run, _plain(models, "copyable"))
    assert len({tuple(t) for t in plain}) == len(plain)  # distinct: not degenerate
    same, stats, runner = anyio.run(_run, _eagle3(models, "copy", "copyable"))
    assert same == plain
    assert _acceptance(stats) == 1.0  # the head computes what the target will
    assert runner.num_draft_rounds > 0 and runner.num_draft_tokens > 0
    chunks = {"max_num_batched_tokens": 8}
    sampled, stats, _ = anyio.run(_run, _eagle3(models, "copy", "copyable", **chunks), 0.8)
    assert sampled == anyio.run(_run, _plain(models, "copyable", **chunks), 0.8)[0]
    assert _acceptance(stats) == 1.0  # sampled too: the head draws with the target's noise


def test_copy_head_as_shipped_accepted(models: dict[str, Path]) -> None:
    """The copy head in the speculators layout (num_speculative_tokens from its
    speculators_config), and saved without lm_head.weight: accepted every time, greedy and
    sampled."""
    plain, _, _ = anyio.run(_run, _plain(models, "copyable"))
    chunks = {"max_num_batched_tokens": 8}
    sampled_plain, _, _ = anyio.run(_run, _plain(models, "copyable", **chunks), 0.8)
    for head, k in (("copy_spec", 2), ("copy_shared", 4), ("copy_spec_shared", 2)):
        config = _eagle3(models, head, "copyable", k=None)  # the head's count, else 4
        assert config.num_speculative_tokens == k
        same, stats, runner = anyio.run(_run, config)
        assert same == plain
        assert _acceptance(stats) == 1.0, head
        assert len(stats.spec_accepted_lengths) == k + 1 and runner.num_draft_tokens > 0
        sampled, stats, _ = anyio.run(
            _run, _eagle3(models, head, "copyable", k=None, **chunks), 0.8
        )
        assert sampled == sampled_plain
        assert _acceptance(stats) == 1.0, head


def test_random_heads_same_tokens_greedy_and_seeded(models: dict[str, Path]) -> None:
    plain, _, _ = anyio.run(_run, _plain(models))
    same, stats, _ = anyio.run(_run, _eagle3(models, "random"))
    assert same == plain
    assert _acceptance(stats) < 0.3
    # "eagle" finds the EAGLE-3 head by its folder; the head's own embedding
    detected, _, _ = anyio.run(_run, _eagle3(models, "own_embed", k=2, speculative_method="eagle"))
    assert detected == plain
    chunks = {"max_num_batched_tokens": 8}
    plain, _, _ = anyio.run(_run, _plain(models, **chunks), 0.8, False, 0.5)
    for head in ("random", "small_vocab"):
        seeded, stats, _ = anyio.run(_run, _eagle3(models, head, **chunks), 0.8, False, 0.5)
        assert seeded == plain
        assert stats.num_spec_proposed_tokens > 0


def test_heads_of_another_width_same_tokens(models: dict[str, Path]) -> None:
    plain, _, _ = anyio.run(_run, _plain(models))
    for head in ("narrow", "wide"):
        same, stats, runner = anyio.run(_run, _eagle3(models, head))
        assert same == plain
        assert runner.num_draft_tokens > 0 and stats.num_spec_proposed_tokens > 0
    chunks = {"max_num_batched_tokens": 8}  # a chunk's last row waits, kept 3 * 64 wide
    plain, _, _ = anyio.run(_run, _plain(models, **chunks), 0.8, False, 0.5)
    for head in ("narrow", "wide"):
        seeded, stats, _ = anyio.run(_run, _eagle3(models, head, **chunks), 0.8, False, 0.5)
        assert seeded == plain
        assert stats.num_spec_proposed_tokens > 0


def test_swap_preemption_same_tokens(models: dict[str, Path]) -> None:
    tight = {"num_kv_blocks": 20, "num_cpu_blocks": 8}
    plain, _, _ = anyio.run(_run, _plain(models), 0.0, True, 0.0, LONG)
    swapped, stats, _ = anyio.run(
        _run, _eagle3(models, "small_vocab", **tight), 0.0, True, 0.0, LONG
    )
    assert swapped == plain
    assert stats.num_preemptions_swap > 0


@pytest.mark.gpu
def test_cuda_graphs_same_tokens_and_copy_head_accepted(models: dict[str, Path]) -> None:
    from troupe.gpu.model_runner import ModelRunner

    cuda = {"device": "cuda"}
    runner = ModelRunner.from_config(_eagle3(models, "copy", "copyable", **cuda))
    assert runner._pass.graphs is not None and runner._pass.mixed is not None  # graphs in use
    runner.close()
    for temperature in (0.0, 0.8):
        plain, _, _ = anyio.run(_run, _plain(models, "copyable", **cuda), temperature)
        for head in ("copy", "copy_spec_shared"):  # the latter: the model's lm_head, k = 2
            config = _eagle3(models, head, "copyable", k=None if "spec" in head else 3, **cuda)
            same, stats, _ = anyio.run(_run, config, temperature)
            assert same == plain
            assert _acceptance(stats) > 0.95
    plain, _, _ = anyio.run(_run, _plain(models, **cuda))
    for head in ("random", "small_vocab", "narrow", "wide"):
        other, stats, _ = anyio.run(_run, _eagle3(models, head, **cuda))
        assert other == plain
        assert _acceptance(stats) < 0.3
    eager, _, _ = anyio.run(_run, _eagle3(models, "random", **cuda, enforce_eager=True))
    assert eager == plain
    tight = {"device": "cuda", "num_kv_blocks": 20, "num_cpu_blocks": 8}
    plain, _, _ = anyio.run(_run, _plain(models, **cuda), 0.0, True, 0.0, LONG)
    swapped, stats, _ = anyio.run(_run, _eagle3(models, "random", **tight), 0.0, True, 0.0, LONG)
    assert swapped == plain
    assert stats.num_preemptions_swap > 0
    bf16 = {"device": "cuda", "dtype": "bfloat16"}
    _, stats, _ = anyio.run(_run, _eagle3(models, "copy", "copyable", **bf16))
    assert _acceptance(stats) > 0.7
