"""num_lookahead_tokens: decoding requests' tables cover one position past their tokens, the
extra blocks are counted (preemption still works in a tiny pool), and outputs do not change."""

from __future__ import annotations

import pytest
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import AdmittedRequest, FinishReason, SampledToken, SamplingParams, StepPlan
from troupe.ops.bench_scheduler import CoreLoop

from tests.actors.core.allocator_invariants import check_allocator


class TableWatcher:
    """A FakeRunner that mirrors the executor's block tables and records, per decode, how many
    positions past its token the table covers."""

    def __init__(self, runner: FakeRunner) -> None:
        self.runner = runner
        self.block_size = runner.block_size
        self.tables: dict[str, list[int]] = {}
        self.decode_slack: list[int] = []  # covered positions - (start_pos + 1), per decode

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        for rid in plan.released:
            self.tables.pop(rid, None)
        for work in plan.seqs:
            if work.reset:
                self.tables[work.request_id] = list(work.block_ids)
            else:
                self.tables[work.request_id].extend(work.block_ids)
            if work.num_tokens == 1 and not work.reset and work.sample:
                covered = len(self.tables[work.request_id]) * self.block_size
                self.decode_slack.append(covered - (work.start_pos + 1))
        return self.runner.execute(plan)


def _loop(
    lookahead: int, *, num_gpu_blocks: int, num_cpu_blocks: int, mode: str = "auto"
) -> tuple[CoreLoop, TableWatcher]:
    bs = 4
    scheduler = SchedulerCore(
        StepLimits(
            block_size=bs,
            num_gpu_blocks=num_gpu_blocks,
            max_num_seqs=8,
            max_num_batched_tokens=64,
            enable_prefix_caching=True,
            num_lookahead_tokens=lookahead,
        ),
        num_cpu_blocks=num_cpu_blocks,
        preemption_mode=mode,
        eos_token_ids=(2,),
    )
    allocator = AllocatorCore(
        block_size=bs,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        enable_prefix_caching=True,
    )
    runner = FakeRunner(
        block_size=bs,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        max_model_len=4096,
    )
    watcher = TableWatcher(runner)
    return CoreLoop(scheduler, allocator, watcher, check=check_allocator), watcher  # type: ignore[arg-type]


def _requests(lengths: list[tuple[int, int]]) -> list[AdmittedRequest]:
    return [
        AdmittedRequest(
            request_id=f"r{i}",
            prompt_token_ids=tuple(100 + (i * 37 + j * 11) % 900 for j in range(prompt)),
            params=SamplingParams(max_tokens=out, ignore_eos=True),
            arrival_time=0.0,
            max_total_tokens=prompt + out,
        )
        for i, (prompt, out) in enumerate(lengths)
    ]


def _run(
    lookahead: int, lengths: list[tuple[int, int]], **kw: int | str
) -> tuple[CoreLoop, TableWatcher]:
    loop, watcher = _loop(lookahead, **kw)  # type: ignore[arg-type]
    loop.submit(_requests(lengths))
    loop.run()
    return loop, watcher


LENGTHS = [(6, 9), (8, 14), (3, 5), (12, 7), (5, 12)]


def test_decodes_cover_one_position_ahead() -> None:
    loop, watcher = _run(1, LENGTHS, num_gpu_blocks=256, num_cpu_blocks=0)
    # every decode's table owns the slot after its token (the first decode grows if needed)
    assert min(watcher.decode_slack) == 1
    assert len(watcher.decode_slack) == sum(out - 1 for _, out in LENGTHS)
    base, base_watcher = _run(0, LENGTHS, num_gpu_blocks=256, num_cpu_blocks=0)
    assert min(base_watcher.decode_slack) == 0  # without lookahead, tables are exact
    assert dict(loop.tokens) == dict(base.tokens)
    for req in _requests(LENGTHS):
        assert loop.tokens[req.request_id] == FakeRunner.reference_tokens(
            req.prompt_token_ids, req.params.max_tokens
        )
    stats = loop.batches[-1].stats
    assert stats is not None and stats.num_gpu_blocks_used == 0


def test_scheduler_tables_cover_lookahead_at_plan_time() -> None:
    """The scheduler's own count: after each plan, decoding requests cover num_tokens + 1."""
    loop, _ = _loop(1, num_gpu_blocks=256, num_cpu_blocks=0)
    scheduler = loop.scheduler
    checked = 0
    original = loop.runner.execute

    def execute(plan: StepPlan) -> tuple[SampledToken, ...]:
        nonlocal checked
        for work in plan.seqs:
            req = scheduler.requests.get(work.request_id)
            if req is not None and work.num_tokens == 1 and work.start_pos >= req.prompt_len:
                assert req.num_blocks * 4 >= req.num_tokens + 1, req
                checked += 1
        return original(plan)

    loop.runner.execute = execute  # type: ignore[method-assign]
    loop.submit(_requests(LENGTHS))
    loop.run()
    assert checked >= 40


@pytest.mark.parametrize(("mode", "num_cpu_blocks"), [("auto", 64), ("recompute", 0)])
def test_preemption_in_a_tiny_pool(mode: str, num_cpu_blocks: int) -> None:
    lengths = [(6, 20), (7, 18), (5, 22), (6, 16)]
    loop, watcher = _run(1, lengths, num_gpu_blocks=14, num_cpu_blocks=num_cpu_blocks, mode=mode)
    base, _ = _run(0, lengths, num_gpu_blocks=14, num_cpu_blocks=num_cpu_blocks, mode=mode)
    stats = loop.batches[-1].stats
    assert stats is not None
    assert stats.num_preemptions_swap + stats.num_preemptions_recompute > 0
    if mode == "recompute":
        assert stats.num_preemptions_swap == 0
    else:
        assert stats.num_preemptions_swap > 0
    assert stats.num_gpu_blocks_used == 0 and stats.num_cpu_blocks_used == 0
    assert dict(loop.tokens) == dict(base.tokens)
    for req in _requests(lengths):
        assert loop.finished[req.request_id] == [(FinishReason.LENGTH, None)]
        assert loop.tokens[req.request_id] == FakeRunner.reference_tokens(
            req.prompt_token_ids, req.params.max_tokens
        )
    assert min(watcher.decode_slack) == 1


def test_negative_lookahead_is_rejected() -> None:
    with pytest.raises(ValueError, match="num_lookahead_tokens"):
        SchedulerCore(
            StepLimits(
                block_size=4,
                num_gpu_blocks=8,
                max_num_seqs=2,
                max_num_batched_tokens=8,
                num_lookahead_tokens=-1,
            ),
            num_cpu_blocks=0,
        )
