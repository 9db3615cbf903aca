"""Overlap for steps under grammar masks (gpu/forward_ahead.py): hand-built masked plans through
launch/finish give the same tokens with and without the forward queued ahead, and the counters
say when the kept forward was used. CPU here (overlap forced on); CUDA graphs with -m gpu."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from troupe.messages import SamplingParams, StepPlan, StructuredOutputs, TokenMasks

from tests.gpu.test_overlap_step import LookaheadDriver, counts, make_runner, prompts

SPEC = StructuredOutputs(regex="a")  # marks a request as constrained; the masks are made here
VOCAB = 256  # the tiny qwen3's vocabulary


def allowed(rid: str, step: int) -> list[int]:
    """A different set of tokens per request and step (so a mask applied to the wrong step
    or row changes the tokens)."""
    salt = sum(map(ord, rid)) + 3 * step
    return [t for t in range(VOCAB) if (t * 7 + salt) % 5 == 0 or (t + salt) % 23 == 0]


def masks_for(step_id: int, rids: list[str]) -> TokenMasks:
    words = (VOCAB + 31) // 32
    bits = np.zeros((len(rids), words), dtype=np.uint32)
    for i, rid in enumerate(rids):
        for t in allowed(rid, step_id):
            bits[i, t // 32] |= np.uint32(1 << (t % 32))
    return TokenMasks(
        step_id=step_id,
        request_ids=tuple(rids),
        num_words=words,
        bitmask=bits.view(np.int32).tobytes(),
    )


class MaskedDriver(LookaheadDriver):
    unconstrained: frozenset[str] = frozenset()  # rows no mask names (all tokens allowed)

    def masks(self, step_id: int, ids: list[str]) -> TokenMasks:
        return masks_for(step_id, [rid for rid in ids if rid not in self.unconstrained])

    def check(self, got: dict[str, int]) -> None:
        for rid, token in got.items():
            assert rid in self.unconstrained or token in allowed(rid, self.step_id), (rid, token)

    def masked_step(self, ids: list[str], released: tuple[str, ...] = ()) -> dict[str, int]:
        works = tuple(self._work(rid) for rid in ids)
        self.step_id += 1
        plan = StepPlan(step_id=self.step_id, seqs=works, released=released, awaits_masks=True)
        self.runner.launch(plan)
        out = self.runner.finish(self.masks(self.step_id, ids))
        got = {t.request_id: t.token_id for t in out}
        self.check(got)
        for rid, token in got.items():
            self.seqs[rid].output.append(token)
        self.log.append(got)
        return got


def both(qwen3: Path, scenario: Any, device: str = "cpu") -> tuple[MaskedDriver, MaskedDriver]:
    plain = MaskedDriver(make_runner(qwen3, overlap=False, device=device))
    over = MaskedDriver(make_runner(qwen3, overlap=True, device=device))
    scenario(plain)
    scenario(over)
    assert over.log == plain.log
    assert counts(plain) == (0, 0)
    return plain, over


def params(penalty: float = 0.0) -> dict[str, SamplingParams]:
    """`penalty`: c keeps a history, so the kept forward is fed host tokens (after the read
    back) instead of the samples on the device."""
    return {
        "a": SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=SPEC),
        "b": SamplingParams(temperature=1.0, seed=5, max_tokens=64, structured_outputs=SPEC),
        "c": SamplingParams(
            temperature=0.8,
            seed=9,
            max_tokens=64,
            structured_outputs=SPEC,
            presence_penalty=penalty,
        ),
    }


@pytest.fixture
def qwen3(hf_folder: Any) -> Path:
    folder, _ = hf_folder("qwen3", max_position_embeddings=128)
    return Path(folder)


def scenario(d: MaskedDriver, penalty: float = 0.0) -> None:
    p = prompts()
    for rid in ("a", "b", "c"):
        d.add(rid, p[rid], params(penalty)[rid])
    for _ in range(4):
        d.masked_step(["a", "b", "c"])  # the prefill, then three kept forwards used
    released = d.finish("b")
    d.masked_step(["a", "c"], released=(released,))  # a subset: still the kept step
    d.step(["a", "c"])  # a plan without masks (execute): drops the kept forward
    d.masked_step(["a", "c"])  # nothing kept: runs its own forward
    d.masked_step(["c", "a"])  # another order: a miss
    d.add("d", [9, 8, 7, 6, 5], params()["a"])
    d.masked_step(["a", "c", "d"])  # a request joins after another order: a miss
    for _ in range(3):
        d.masked_step(["a", "c", "d"])
    d.add("e", [4, 4, 2, 7], params(penalty)["b"])
    # the kept step plus a request joining: the kept logits answer a, c, d; e runs its own
    d.masked_step(["a", "c", "d", "e"])
    for _ in range(2):
        d.masked_step(["a", "c", "d", "e"])


@pytest.mark.parametrize("penalty", [0.0, 0.5])
def test_kept_forward_gives_the_same_tokens(qwen3: Path, penalty: float) -> None:
    _, over = both(qwen3, lambda d: scenario(d, penalty))
    # a forward kept after each of the 14 masked steps (all sample), and DecodeOverlap's
    # early step after the plain one; used by the 3 + 1 + 3 + 3 masked plans that matched
    launched, hits = counts(over)
    assert (launched, hits) == (14 + 1, 10)
    assert over.runner.statistics().num_steps == 15


@pytest.mark.gpu
def test_kept_forward_in_cuda_graphs(qwen3: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    _, over = both(qwen3, scenario, device="cuda")
    assert counts(over)[1] == 10
