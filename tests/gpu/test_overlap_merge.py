"""Merged splits (gpu/overlap_merge.py): chunks that sample nothing, a prompt's held-back last
token among them, join the decodes' overlapped next step as one forward; the same hand-built
plans through an overlapping runner and a plain one give the same tokens (test_overlap_step.py's
driver), and the counters say when the merge happened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from troupe.messages import SamplingParams

from tests.gpu.test_overlap_step import GREEDY, LookaheadDriver, both, counts, prompts


@pytest.fixture
def qwen3(hf_folder: Any) -> Path:
    folder, _ = hf_folder("qwen3", max_position_embeddings=128)
    return Path(folder)


@pytest.mark.parametrize("penalty", [False, True])
def test_held_back_token_is_sampled_with_the_decodes_next_step(qwen3: Path, penalty: bool) -> None:
    """A prompt joining decodes without its last token: its chunk and that token join the
    decodes' next step (one forward), so the next plan, with the token as a decode, is a hit.
    A decode with a penalty history cannot be fed on the device: the chunk runs alone."""
    b_params = SamplingParams(temperature=0.9, seed=11, max_tokens=64)
    if penalty:
        b_params = SamplingParams(temperature=0.9, seed=11, presence_penalty=0.5, max_tokens=64)
    c_params = SamplingParams(temperature=0.7, seed=5, max_tokens=64)

    def scenario(d: LookaheadDriver) -> None:
        p = prompts()
        d.add("a", p["a"])
        d.add("b", p["b"], b_params)
        for _ in range(3):
            d.step(["a", "b"])
        d.add("c", [(19 * j + 7) % 256 for j in range(13)], c_params)
        d.step(["a", "b", "c"], hold=("c",))
        d.step(["a", "b", "c"])  # c's held-back token: its first sample
        for _ in range(3):
            d.step(["a", "b", "c"])

    plain, over = both(qwen3, scenario)
    stats = over.runner.statistics()
    assert stats.num_overlap_splits == 1 + penalty  # penalty: the held token is an extra too
    assert stats.num_overlap_merges == (0 if penalty else 1)
    assert counts(over) == (8, 7)
    assert len(plain.seqs["c"].output) == 4 and len(set(plain.seqs["c"].output)) > 1


@pytest.mark.parametrize(
    ("device", "mixed_graph_tokens"),
    [
        ("cpu", 0),
        pytest.param("cuda", 0, marks=pytest.mark.gpu),
        pytest.param("cuda", 64, marks=pytest.mark.gpu),
    ],
)
def test_merged_splits_same_tokens(qwen3: Path, device: str, mixed_graph_tokens: int) -> None:
    """A mid-prompt chunk and a held-back prompt join the decodes' next step (on CUDA eagerly
    and in a mixed-step graph), the decodes' ids fed from the device (a subset gathered)."""
    params = {
        "a": GREEDY,
        "b": SamplingParams(temperature=0.9, seed=7, max_tokens=64),
        "c": SamplingParams(temperature=0.8, seed=3, top_p=0.9, max_tokens=64),
        "d": SamplingParams(temperature=0.7, seed=5, max_tokens=64),
    }

    def scenario(d: LookaheadDriver) -> None:
        p = prompts()
        for rid in ("a", "b", "c"):
            d.add(rid, p[rid], params[rid])
        for _ in range(3):
            d.step(["a", "b", "c"])
        d.add("d", [(19 * j + 7) % 256 for j in range(21)], params["d"])
        d.step(["a", "b", "c", "d"], chunks={"d": 8})  # mid-prompt
        d.step(["a", "c", "d"], released=(d.finish("b"),), hold=("d",))  # a subset + held
        for _ in range(4):
            d.step(["a", "c", "d"])

    _, over = both(qwen3, scenario, device=device, mixed_graph_tokens=mixed_graph_tokens)
    stats = over.runner.statistics()
    assert stats.num_overlap_merges == 2
    assert counts(over) == (9, 8)
