"""Blocks behind every layer's sliding window are released while a request runs: a generation of
8x the window holds window-sized KV, the positions it still attends to are always its own, and
swap, preemption and the prefix cache keep working (the allocator's invariants hold throughout)."""

from __future__ import annotations

from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.scheduler import SchedulerCore
from troupe.actors.core.step_limits import StepLimits
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import AdmittedRequest, SampledToken, SamplingParams, StepPlan
from troupe.ops.bench_scheduler import CoreLoop

from tests.actors.core.allocator_invariants import check_allocator

BS = 4
WINDOW = 10


class WindowWatcher:
    """A FakeRunner that mirrors the executor's tables and checks, each step, that every block a
    query's window reaches is one the allocator says the request holds."""

    def __init__(self, runner: FakeRunner, allocator: AllocatorCore, window: int) -> None:
        self.runner = runner
        self.allocator = allocator
        self.window = window
        self.tables: dict[str, list[int]] = {}
        self.num_checked = 0

    def execute(self, plan: StepPlan) -> tuple[SampledToken, ...]:
        for rid in plan.released:
            self.tables.pop(rid, None)
        for work in plan.seqs:
            table = self.tables.setdefault(work.request_id, [])
            if work.reset:
                table[:] = work.block_ids
            else:
                table.extend(work.block_ids)
            seq = self.allocator.seqs[work.request_id]
            held = set(seq.held())
            first = max(0, work.start_pos - self.window + 1) // BS
            last = (work.start_pos + len(work.token_ids) - 1) // BS
            assert set(table[first : last + 1]) <= held, "a window reaches a released block"
            self.num_checked += 1
        return self.runner.execute(plan)


def _run(
    lengths: list[tuple[int, int]], *, window: int, num_gpu_blocks: int, mode: str = "auto",
    num_cpu_blocks: int = 0, lookahead: int = 0, same_prompts: bool = False,
) -> tuple[CoreLoop, WindowWatcher, list[int]]:  # fmt: skip
    """Run the requests; also returns the most GPU blocks held at once, per allocator batch."""
    scheduler = SchedulerCore(
        StepLimits(
            block_size=BS,
            num_gpu_blocks=num_gpu_blocks,
            max_num_seqs=8,
            max_num_batched_tokens=8,
            num_lookahead_tokens=lookahead,
            kv_window=window,
        ),
        num_cpu_blocks=num_cpu_blocks,
        preemption_mode=mode,
        eos_token_ids=(2,),
    )
    allocator = AllocatorCore(
        block_size=BS, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks
    )
    runner = FakeRunner(
        block_size=BS, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
        max_model_len=4096, kv_window=window,
    )  # fmt: skip
    watcher = WindowWatcher(runner, allocator, window or 10**9)
    held: list[int] = []

    def check(alloc: AllocatorCore) -> None:
        check_allocator(alloc)
        held.append(alloc.gpu.num_blocks - alloc.gpu.num_free)

    loop = CoreLoop(scheduler, allocator, watcher, check=check)  # type: ignore[arg-type]
    requests = [
        AdmittedRequest(
            request_id=f"r{i}",
            prompt_token_ids=tuple(
                100 + ((0 if same_prompts else i) * 37 + j * 11) % 900 for j in range(prompt)
            ),
            params=SamplingParams(max_tokens=out, ignore_eos=True),
            arrival_time=0.0,
            max_total_tokens=prompt + out,
        )
        for i, (prompt, out) in enumerate(lengths)
    ]
    loop.submit(requests)
    loop.run()
    for req in requests:
        assert loop.tokens[req.request_id] == FakeRunner.reference_tokens(
            req.prompt_token_ids, req.params.max_tokens, kv_window=window, block_size=BS
        )
    assert allocator.gpu.num_free == num_gpu_blocks and not allocator.seqs  # all came back
    return loop, watcher, held


def test_long_generation_holds_window_sized_kv() -> None:
    """8x the window in a pool far smaller than the request: the held blocks stay bounded by
    the window (plus a partial block each side and one step's tokens)."""
    total = 6 + 8 * WINDOW
    _loop, watcher, held = _run([(6, 8 * WINDOW)], window=WINDOW, num_gpu_blocks=8)
    assert -(-total // BS) > 8  # it could not have run holding everything
    bound = -(-(WINDOW + 1) // BS) + 1
    assert max(held) <= bound, (max(held), bound)
    assert watcher.num_checked >= 8 * WINDOW
    _without, _, held_all = _run([(6, 8 * WINDOW)], window=0, num_gpu_blocks=64)
    assert max(held_all) == -(-total // BS)  # no window: everything stays until the end


def test_windowed_requests_share_a_small_pool_with_lookahead() -> None:
    lengths = [(6, 40), (9, 33), (3, 45), (14, 30)]
    loop, _watcher, held = _run(lengths, window=WINDOW, num_gpu_blocks=16, lookahead=1)
    assert loop.num_refused == 0
    assert max(held) <= 16


def test_swap_and_recompute_with_released_blocks() -> None:
    lengths = [(6, 40), (9, 33), (3, 45), (14, 30), (5, 41)]
    for mode, cpu in (("swap", 64), ("recompute", 0)):
        loop, _watcher, _ = _run(
            lengths, window=WINDOW, num_gpu_blocks=9, mode=mode, num_cpu_blocks=cpu
        )
        stats = loop.scheduler.stats()
        assert stats.num_preemptions_swap + stats.num_preemptions_recompute > 0, mode
        assert loop.num_refused == 0


def test_shared_prefixes_released_behind_the_window() -> None:
    """Requests sharing a cached prompt prefix release it behind their windows one by one: the
    allocator's sharing counts stay true (check_allocator) and nothing is refused."""
    loop, _, _ = _run([(20, 30)] * 4, window=WINDOW, num_gpu_blocks=24, same_prompts=True)
    assert loop.num_refused == 0
    assert loop.scheduler.stats().prefix_cache_hit_tokens > 0
