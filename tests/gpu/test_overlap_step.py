"""Overlap scheduling in the ModelRunner (gpu/overlap.py): the same hand-built plans through an
overlapping runner and a plain one give the same tokens, and the hit counters say when the early
step was used. On the CPU the runner is built with overlap forced on (from a config it never
overlaps there); on CUDA (-m gpu) with graphs too. Through the whole engine, and the config
switch: test_overlap_step_engine.py; splits merged into one forward: test_overlap_merge.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from troupe.gpu.model_runner import ModelRunner, RunnerOptions
from troupe.gpu.runner import RunnerStats
from troupe.gpu.weights import load_model
from troupe.messages import SamplingParams, SeqWork, StepPlan

BLOCK_SIZE = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


def make_runner(
    path: Path, *, overlap: bool, device: str = "cpu", mixed_graph_tokens: int = 0
) -> ModelRunner:
    config, model = load_model(path, torch.float32, torch.device(device), 128)
    options = RunnerOptions(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=64,
        num_cpu_blocks=32,
        max_num_seqs=8,
        max_model_len=128,
        overlap_schedule=overlap,
        enforce_eager=device == "cpu",
        mixed_graph_tokens=mixed_graph_tokens,
    )
    return ModelRunner(config, model, options)


@dataclasses.dataclass
class Seq:
    prompt: list[int]
    params: SamplingParams
    blocks: list[int] = dataclasses.field(default_factory=list)
    cpu_blocks: list[int] = dataclasses.field(default_factory=list)
    num_computed: int = 0
    output: list[int] = dataclasses.field(default_factory=list)
    needs_reset: bool = True

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class LookaheadDriver:
    """Hand-built plans like the scheduler's with num_lookahead_tokens=1: whole prompts, then
    decodes, each table covering one position past the chunk it computes."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.free = list(range(runner.num_gpu_blocks))
        self.cpu_free = list(range(runner.num_cpu_blocks))
        self.seqs: dict[str, Seq] = {}
        self.step_id = 0
        self.log: list[dict[str, int]] = []  # sampled tokens per step

    def add(self, rid: str, prompt: list[int], params: SamplingParams = GREEDY) -> None:
        self.seqs[rid] = Seq(prompt, params)

    def _work(self, rid: str, chunk: int | None = None, hold: bool = False) -> SeqWork:
        """The rest of the request's tokens, or its next `chunk` of them (mid-prompt: no
        sample); `hold`: the rest but the last, held back as the scheduler does beside
        running decodes (SeqWork.next_token)."""
        seq = self.seqs[rid]
        tokens = seq.tokens[seq.num_computed :][:chunk]
        next_token = -1
        if hold:
            tokens, next_token = tokens[:-1], tokens[-1]
        end = seq.num_computed + len(tokens)
        need = -(-(end + 1) // BLOCK_SIZE) - len(seq.blocks)  # the lookahead position too
        added = [self.free.pop(0) for _ in range(max(need, 0))]
        seq.blocks += added
        first = not any(seq.output) and seq.num_computed == 0
        work = SeqWork(
            request_id=rid,
            token_ids=tuple(tokens),
            start_pos=seq.num_computed,
            block_ids=tuple(seq.blocks) if seq.needs_reset else tuple(added),
            reset=seq.needs_reset,
            params=seq.params if first else None,
            num_prompt_tokens=len(seq.prompt) if first else 0,
            sample=end == len(seq.tokens),
            next_token=next_token,
        )
        seq.needs_reset = False
        seq.num_computed = end
        return work

    def step(
        self,
        ids: list[str],
        chunks: dict[str, int] | None = None,
        hold: tuple[str, ...] = (),
        **fields: Any,
    ) -> dict[str, int]:
        works = tuple(self._work(rid, (chunks or {}).get(rid), rid in hold) for rid in ids)
        self.step_id += 1
        out = self.runner.execute(StepPlan(step_id=self.step_id, seqs=works, **fields))
        got = {t.request_id: t.token_id for t in out}
        assert list(got) == [w.request_id for w in works if w.sample]
        for rid, token in got.items():
            self.seqs[rid].output.append(token)
        self.log.append(got)
        return got

    def finish(self, rid: str) -> str:
        """End a request: its blocks return to the pool; release it in the next plan."""
        seq = self.seqs.pop(rid)
        self.free += seq.blocks
        return rid

    def swap_out(self, rid: str) -> tuple[tuple[int, int], ...]:
        seq = self.seqs[rid]
        seq.cpu_blocks = [self.cpu_free.pop(0) for _ in seq.blocks]
        pairs = tuple(zip(seq.blocks, seq.cpu_blocks, strict=True))
        self.free += seq.blocks
        seq.blocks = []
        return pairs

    def swap_in(self, rid: str) -> tuple[tuple[int, int], ...]:
        seq = self.seqs[rid]
        seq.blocks = [self.free.pop(0) for _ in seq.cpu_blocks]
        pairs = tuple(zip(seq.cpu_blocks, seq.blocks, strict=True))
        self.cpu_free += seq.cpu_blocks
        seq.cpu_blocks = []
        seq.needs_reset = True
        return pairs


@pytest.fixture
def qwen3(hf_folder: Any) -> Path:
    folder, _ = hf_folder("qwen3", max_position_embeddings=128)
    return Path(folder)


def both(
    qwen3: Path, scenario: Any, device: str = "cpu", mixed_graph_tokens: int = 0
) -> tuple[LookaheadDriver, LookaheadDriver]:
    """Run `scenario(driver)` on a plain and an overlapping runner; assert equal tokens."""
    plain = LookaheadDriver(make_runner(qwen3, overlap=False, device=device))
    over = LookaheadDriver(
        make_runner(qwen3, overlap=True, device=device, mixed_graph_tokens=mixed_graph_tokens)
    )
    scenario(plain)
    scenario(over)
    assert over.log == plain.log
    assert plain.runner.statistics().num_overlapped == 0
    assert plain.runner.num_lookahead_tokens == 0
    assert over.runner.num_lookahead_tokens == 1
    assert over.runner.statistics().num_steps == plain.runner.statistics().num_steps
    return plain, over


def counts(driver: LookaheadDriver) -> tuple[int, int]:
    """(overlapped steps launched, those whose plan matched)."""
    stats = driver.runner.statistics()
    return stats.num_overlapped, stats.num_overlap_hits


def prompts() -> dict[str, list[int]]:
    return {
        "a": [(7 * j + 3) % 256 for j in range(5)],
        "b": [(11 * j + 1) % 256 for j in range(7)],
        "c": [(13 * j + 5) % 256 for j in range(8)],  # ends on a block boundary
    }


def test_pure_decode_hits_every_step(qwen3: Path) -> None:
    def scenario(d: LookaheadDriver) -> None:
        for rid, prompt in prompts().items():
            d.add(rid, prompt)
        for _ in range(9):
            d.step(["a", "b", "c"])

    plain, over = both(qwen3, scenario)
    assert counts(over) == (9, 8)  # launched after the prefill and after each decode
    assert len({tuple(s.output) for s in plain.seqs.values()}) == 3  # not a degenerate model


def test_request_finishing_is_a_subset_hit(qwen3: Path) -> None:
    def scenario(d: LookaheadDriver) -> None:
        for rid, prompt in prompts().items():
            d.add(rid, prompt)
        for _ in range(3):
            d.step(["a", "b", "c"])
        released = d.finish("b")
        d.step(["a", "c"], released=(released,))
        d.runner.execute(StepPlan(step_id=99, seqs=(), released=()))  # nothing to run
        for _ in range(3):
            d.step(["a", "c"])
        d.finish("a")
        d.step(["c"])  # released later: state lingers, the plan is still a subset

    _, over = both(qwen3, scenario)
    assert counts(over) == (8, 7)


def test_new_request_misses_then_hits_again(qwen3: Path) -> None:
    def scenario(d: LookaheadDriver) -> None:
        p = prompts()
        d.add("a", p["a"])
        d.add("b", p["b"])
        for _ in range(3):
            d.step(["a", "b"])
        d.add("c", p["c"])
        d.step(["a", "b", "c"])  # a prefill joins: a split; then all three launch together
        for _ in range(3):
            d.step(["a", "b", "c"])
        d.step(["b", "a", "c"])  # another order: miss

    _, over = both(qwen3, scenario)
    assert counts(over) == (8, 2 + 1 + 3)
    assert over.runner.statistics().num_overlap_splits == 1


def test_prefill_chunks_beside_decodes_split_every_step(qwen3: Path) -> None:
    params = {
        "a": GREEDY,
        "b": SamplingParams(temperature=0.9, seed=11, max_tokens=64),
        "c": SamplingParams(temperature=0.8, seed=4, repetition_penalty=1.2, max_tokens=64),
        "d": SamplingParams(temperature=1.1, seed=8, top_k=30, max_tokens=64),
    }
    long_prompt = [(17 * j + 2) % 256 for j in range(23)]

    def scenario(d: LookaheadDriver) -> None:
        p = prompts()
        d.add("a", p["a"], params["a"])
        d.add("b", p["b"], params["b"])
        for _ in range(2):
            d.step(["a", "b"])
        d.add("c", long_prompt, params["c"])  # a penalty history: its launches read the host
        for _ in range(3):
            d.step(["a", "b", "c"], chunks={"c": 6})  # mid-prompt: the decodes go first
        d.step(["a", "b", "c"])  # its last chunk samples: all three launch after it
        d.add("d", p["c"], params["d"])
        d.step(["a", "c", "d"], released=(d.finish("b"),))  # one ends as another joins
        for _ in range(3):
            d.step(["a", "c", "d"])

    plain, over = both(qwen3, scenario)
    stats = over.runner.statistics()
    # launched: after the first prefill, each decode step, and each split; every step but
    # the first is answered by the pending one (five of them in part)
    assert stats.num_overlap_splits == 5
    # the three mid-prompt chunks joined the decodes' next step (a and b keep no history)
    assert stats.num_overlap_merges == 3
    assert counts(over) == (10, 9)
    assert len(plain.seqs["c"].output) == 5 and len(set(plain.seqs["d"].output)) > 1


def test_swap_out_is_a_miss(qwen3: Path) -> None:
    def scenario(d: LookaheadDriver) -> None:
        for rid, prompt in prompts().items():
            d.add(rid, prompt)
        for _ in range(3):
            d.step(["a", "b", "c"])
        d.step(["a", "b"], swap_out=d.swap_out("c"))  # miss, though a subset
        d.step(["a", "b"])
        d.step(["a", "b", "c"], swap_in=d.swap_in("c"))  # miss: swap-in and a reset
        for _ in range(2):
            d.step(["a", "b", "c"])

    _, over = both(qwen3, scenario)
    assert counts(over) == (8, 2 + 1 + 2)


def test_seeded_sampling_and_penalties_match(qwen3: Path) -> None:
    params = {
        "a": SamplingParams(temperature=0.9, seed=1234, max_tokens=64),
        "b": SamplingParams(temperature=1.3, seed=99, top_k=20, top_p=0.9, max_tokens=64),
        "c": SamplingParams(
            temperature=0.7,
            seed=5,
            repetition_penalty=1.3,
            frequency_penalty=0.4,
            presence_penalty=0.2,
            max_tokens=64,
        ),
    }

    def scenario(d: LookaheadDriver) -> None:
        for rid, prompt in prompts().items():
            d.add(rid, prompt, params[rid])
        for _ in range(5):
            d.step(["a", "b", "c"])
        d.step(["a", "c"], swap_out=d.swap_out("b"))  # a discarded step must not skew history
        for _ in range(4):
            d.step(["a", "c"])

    plain, over = both(qwen3, scenario)
    assert counts(over)[1] == 4 + 4
    assert len(set(plain.seqs["a"].output)) > 3  # really sampled, not a constant


@pytest.mark.gpu
def test_cuda_graphs_same_tokens(qwen3: Path) -> None:
    """On CUDA with graphs: early launches fed device ids, subsets gathered on the device."""
    greedy_and_seeded = {
        "a": GREEDY,
        "b": SamplingParams(temperature=0.9, seed=7, max_tokens=64),
        "c": SamplingParams(temperature=0.8, seed=3, top_p=0.9, max_tokens=64),
    }

    def scenario(d: LookaheadDriver) -> None:
        for rid, prompt in prompts().items():
            d.add(rid, prompt, greedy_and_seeded[rid])
        for _ in range(6):
            d.step(["a", "b", "c"])
        d.step(["a", "c"], released=(d.finish("b"),))
        for _ in range(4):
            d.step(["a", "c"])

    _, over = both(qwen3, scenario, device="cuda")
    assert over.runner._pass.graphs is not None
    assert counts(over) == (11, 10)


def test_no_overlap_without_lookahead_or_with_logprobs(qwen3: Path) -> None:
    runner = make_runner(qwen3, overlap=True)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]  # 8 tokens: exactly two blocks, no room for position 8
    work = SeqWork(
        request_id="x",
        token_ids=tuple(prompt),
        start_pos=0,
        block_ids=(0, 1),
        reset=True,
        params=GREEDY,
        num_prompt_tokens=8,
    )
    runner.execute(StepPlan(step_id=1, seqs=(work,)))
    assert runner.statistics() == RunnerStats(num_steps=1)
    logprob = SamplingParams(temperature=0.0, logprobs=2, max_tokens=8)
    work = SeqWork(
        request_id="y",
        token_ids=tuple(prompt),
        start_pos=0,
        block_ids=(2, 3, 4),
        reset=True,
        params=logprob,
        num_prompt_tokens=8,
    )
    (token,) = runner.execute(StepPlan(step_id=2, seqs=(work,), released=("x",)))
    assert token.logprob is not None
    assert runner.statistics() == RunnerStats(num_steps=2)
