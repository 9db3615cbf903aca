"""Masked steps drawn before their plan (EngineConfig.draw_masked_ahead; gpu/forward_ahead.py):
the masks filled ahead reach the runner first (`draw_ahead`), the plan then only confirms. The
tokens equal those of the runner that samples after the plan, also when the plan turns out not
to be the drawn step (an ended request dropped, another order, a request joining, a plan
without masks), with penalty state (host tokens), and across block boundaries. CPU with
overlap forced on; CUDA graphs with -m gpu."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from troupe.actors.core.executor import ExecutorCore
from troupe.gpu.runner import DrawsAhead
from troupe.messages import SamplingParams, StepPlan, TokenMasks

from tests.gpu.test_forward_ahead import MaskedDriver, masks_for, params
from tests.gpu.test_overlap_step import make_runner, prompts


@pytest.fixture
def qwen3(hf_folder: Any) -> Path:
    folder, _ = hf_folder("qwen3", max_position_embeddings=128)
    return Path(folder)


class DrawDriver(MaskedDriver):
    """Sends the masks filled ahead (the previous masked step's rows, as the grammar fills
    them) before each masked plan, as the executor does when they come first."""

    kept: list[str] | None = None  # the rows of the last masked step, if the last was masked
    ended: frozenset[str] = frozenset()  # rows the masks filled ahead name as ended

    def ahead_masks(self, rows: list[str]) -> TokenMasks:
        """The rows' masks for this step, under the previous step's id, as the grammar fills
        them: the live rows, then those that ended (no bits, named in `failed`)."""
        live = [rid for rid in rows if rid not in self.ended]
        ended = [rid for rid in rows if rid in self.ended]
        masks = self.masks(self.step_id, live)
        words = masks.num_words
        return msgspec.structs.replace(
            masks,
            step_id=self.step_id - 1,
            ahead=True,
            request_ids=masks.request_ids + tuple(ended),
            bitmask=masks.bitmask + bytes(4 * words * len(ended)),
            failed=tuple((rid, "sampled past the end of its grammar") for rid in ended),
        )

    def masked_step(self, ids: list[str], released: tuple[str, ...] = ()) -> dict[str, int]:
        works = tuple(self._work(rid) for rid in ids)
        self.step_id += 1
        rows = self.kept or []
        ahead = None
        if rows:
            ahead = self.ahead_masks(rows)
            self.runner.draw_ahead(ahead)
        joined = [rid for rid in ids if rid not in rows]
        plan = StepPlan(
            step_id=self.step_id,
            seqs=works,
            released=released,
            awaits_masks=bool(joined),
            ahead_masks_of=self.step_id - 1 if ahead is not None else None,
        )
        self.runner.launch(plan)
        masks = ahead if ahead is not None and not joined else self.masks(self.step_id, ids)
        out = self.runner.finish(masks)
        got = {t.request_id: t.token_id for t in out}
        assert list(got) == ids
        self.check(got)
        for rid, token in got.items():
            self.seqs[rid].output.append(token)
        self.log.append(got)
        self.kept = ids
        return got

    def step(self, ids: list[str], *args: object, **fields: object) -> dict[str, int]:
        self.kept = None
        return super().step(ids, *args, **fields)  # type: ignore[arg-type]


def scenario(d: MaskedDriver, penalty: float) -> None:
    p = prompts()
    for rid in ("a", "b", "c"):
        d.add(rid, p[rid], params(penalty)[rid])
    for _ in range(20):  # the prefill, then drawn steps across block boundaries (block 4)
        d.masked_step(["a", "b", "c"])
    released = d.finish("b")
    d.ended = frozenset("b")  # the grammar names b ended (its last token was a stop)
    d.masked_step(["a", "c"], released=(released,))  # drawn with b, answered without it
    d.ended = frozenset()
    d.step(["a", "c"])  # a plan without masks: the kept forward is dropped
    d.masked_step(["a", "c"])  # nothing kept, nothing drawn
    d.masked_step(["c", "a"])  # drawn, but the plan is another order: runs its own forward
    d.add("d", [9, 8, 7, 6, 5], params()["a"])
    d.masked_step(["c", "a", "d"])  # drawn; a request joins: its own masks, a miss
    for _ in range(4):
        d.masked_step(["c", "a", "d"])
    d.unconstrained = frozenset("f")  # a request without a grammar, in the masked steps
    d.add("f", [3, 1, 4], SamplingParams(temperature=0.7, seed=2, max_tokens=64))
    d.masked_step(["c", "a", "d", "f"])  # joins: a miss
    for _ in range(3):
        d.masked_step(["c", "a", "d", "f"])  # drawn: f's row is in no mask


def run_both(qwen3: Path, penalty: float, device: str = "cpu") -> DrawDriver:
    plain = MaskedDriver(make_runner(qwen3, overlap=True, device=device))
    drawn = DrawDriver(make_runner(qwen3, overlap=True, device=device))
    scenario(plain, penalty)
    scenario(drawn, penalty)
    assert drawn.log == plain.log
    assert plain.runner._ahead.num_drawn == 0
    return drawn


@pytest.mark.parametrize("penalty", [0.0, 0.5])
def test_drawn_ahead_gives_the_same_tokens(qwen3: Path, penalty: float) -> None:
    drawn = run_both(qwen3, penalty)
    # 19 drawn steps of a, b, c, then a + c without b and 4 of c, a, d
    assert drawn.runner._ahead.num_drawn == 19 + 1 + 4 + 3


def test_the_executor_hands_masks_that_come_first_to_the_runner(qwen3: Path) -> None:
    runner = make_runner(qwen3, overlap=True)
    assert isinstance(runner, DrawsAhead)
    seen: list[TokenMasks] = []
    core = ExecutorCore(runner, draw_ahead=seen.append)
    ahead = msgspec.structs.replace(masks_for(1, ["a"]), ahead=True)
    assert core.handle([ahead]) == [] and seen == [ahead]  # no plan yet: drawn ahead
    fresh = masks_for(2, ["a"])
    assert core.handle([fresh]) == [] and seen == [ahead]  # a step's own masks: not drawn
    off = ExecutorCore(runner)
    assert off.handle([ahead]) == []  # without the seam: the masks only wait for their plan


@pytest.mark.gpu
def test_drawn_ahead_in_cuda_graphs(qwen3: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    drawn = run_both(qwen3, 0.0, device="cuda")
    assert drawn.runner._ahead.num_drawn == 27
