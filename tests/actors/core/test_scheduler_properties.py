"""Property tests: scheduler + allocator + fake runner under random load, tiny pools, aborts.

Whatever the pool size, queue policy and preemption mode, every request that is not aborted
must produce exactly the tokens it produces with an unlimited pool (with or without the prefix
cache's CPU tier) (the fake runner's output
depends on every KV slot it reads back), end exactly once and in bounded time (nothing starves),
and leave every block free or cached. The planner counts what it may ask for exactly enough that
the real allocator never refuses; an allocator that refuses at random shows the scheduler
survives refusals all the same.
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.speculator import SpecSettings
from troupe.gpu.fake_runner import EOS_SEED_BASE, FakeRunner
from troupe.messages import AbortRequest, AdmittedRequest, FinishReason, SamplingParams
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    AllocOp,
    FreeRequest,
    Grow,
    SwapIn,
    SwapOut,
)
from troupe.messages.scheduler import AllocationResult, Refusal, RefusalReason
from troupe.ops.bench_scheduler import build_loop

from tests.actors.core.allocator_invariants import check_allocator

BLOCK = 4
# Deliveries (scheduler inbox batches) a workload may take: each request needs at most a few
# per token it computes; far more means something waits forever.
MAX_DELIVERIES = 4000


class RefusingAllocator(AllocatorCore):
    """The real allocator, but it refuses the ops `refusals` picks (consumed from the end, one
    per Grow/SwapIn/AllocateNew/SwapOut, until none are left): refused ops are dropped, as a
    real refusal leaves the request unchanged, and a refused SwapOut frees the request."""

    def __init__(self, refusals: list[bool], **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.refusals = refusals

    def apply(self, batch: AllocateBatch) -> AllocationResult:
        ops: list[AllocOp] = []
        refused: list[Refusal] = []
        for op in batch.ops:
            if not isinstance(op, Grow | SwapIn | AllocateNew | SwapOut) or not (
                self.refusals and self.refusals.pop()
            ):
                ops.append(op)
            elif isinstance(op, SwapOut):
                ops.append(FreeRequest(op.request_id))
                refused.append(Refusal(op.request_id, RefusalReason.NO_CPU_BLOCKS))
            else:
                refused.append(Refusal(op.request_id, RefusalReason.NO_GPU_BLOCKS))
        result = super().apply(AllocateBatch(step_id=batch.step_id, ops=tuple(ops)))
        return msgspec.structs.replace(result, refused=result.refused + tuple(refused))


@st.composite
def workloads(draw: st.DrawFn) -> dict:
    num = draw(st.integers(1, 10))
    # A two-token vocabulary makes equal blocks (prefix-cache sharing) common.
    tokens = st.integers(100, draw(st.sampled_from([101, 120])))
    shared = draw(st.lists(tokens, min_size=0, max_size=9))
    reqs = []
    for i in range(num):
        own = draw(st.lists(tokens, min_size=1, max_size=14))
        max_tokens = draw(st.integers(1, 24))
        eos_at = draw(st.sampled_from([None, None, None, 1, 3]))
        seed = EOS_SEED_BASE + eos_at if eos_at is not None else draw(st.integers(0, 3))
        params = SamplingParams(
            max_tokens=max_tokens,
            priority=draw(st.integers(-1, 2)),
            seed=seed,
        )
        prompt = tuple(shared + own) if draw(st.booleans()) else tuple(own)
        at = draw(st.integers(0, 12))
        abort_at = draw(st.one_of(st.none(), st.none(), st.integers(0, 40)))
        reqs.append((f"r{i}", prompt, params, at, abort_at))
    return {
        "reqs": reqs,
        "num_gpu_blocks": draw(st.integers(6, 20)),
        "num_cpu_blocks": draw(st.sampled_from([0, 3, 8, 64])),
        "max_num_seqs": draw(st.integers(1, 8)),
        "budget": draw(st.integers(4, 40)),
        "caching": draw(st.booleans()),
        "cpu_tier": draw(st.booleans()),  # evicted cached blocks move to the CPU pool
        "policy": draw(st.sampled_from(["fcfs", "priority"])),
        "refusals": draw(st.lists(st.booleans(), max_size=80)),
    }


def _expected(prompt: tuple[int, ...], params: SamplingParams) -> tuple[list[int], FinishReason]:
    tokens = FakeRunner.reference_tokens(prompt, params.max_tokens, params)
    if 2 in tokens:
        return tokens[: tokens.index(2) + 1], FinishReason.STOP
    return tokens, FinishReason.LENGTH


def _run(
    w: dict, mode: str, refusing: bool = False, speculative: SpecSettings | None = None
) -> None:
    loop = build_loop(
        block_size=BLOCK,
        num_gpu_blocks=w["num_gpu_blocks"],
        num_cpu_blocks=w["num_cpu_blocks"],
        max_num_seqs=w["max_num_seqs"],
        max_num_batched_tokens=w["budget"],
        enable_prefix_caching=w["caching"],
        preemption_mode=mode,
        scheduling_policy=w["policy"],
        check=check_allocator,
        speculative=speculative,
        cpu_prefix_tier=w["cpu_tier"],
    )
    if refusing:
        loop.allocator = RefusingAllocator(
            list(w["refusals"]),
            block_size=BLOCK,
            num_gpu_blocks=w["num_gpu_blocks"],
            num_cpu_blocks=w["num_cpu_blocks"],
            enable_prefix_caching=w["caching"],
            cpu_prefix_tier=w["cpu_tier"],
        )
    inject: dict[int, list] = {}
    for rid, prompt, params, at, abort_at in w["reqs"]:
        msg = AdmittedRequest(
            request_id=rid,
            prompt_token_ids=prompt,
            params=params,
            arrival_time=float(at),
            max_total_tokens=len(prompt) + params.max_tokens,
        )
        inject.setdefault(at, []).append(msg)
        if abort_at is not None:
            inject.setdefault(at + abort_at, []).append(AbortRequest(request_id=rid))
    inject.setdefault(0, []).append(AbortRequest(request_id="nobody"))  # unknown: ignored
    loop.run(inject, max_deliveries=MAX_DELIVERIES)
    if not refusing:
        assert loop.num_refused == 0, "the planner asked for blocks it had not counted"

    pool_tokens = w["num_gpu_blocks"] * BLOCK
    for rid, prompt, params, _, abort_at in w["reqs"]:
        ends = loop.finished[rid]
        assert len(ends) == 1, f"{rid}: terminal events {ends}"
        reason, error = ends[0]
        tokens, expected_reason = _expected(prompt, params)
        if reason == FinishReason.ABORT:
            assert abort_at is not None
            assert loop.tokens[rid] == tokens[: len(loop.tokens[rid])]
        elif reason == FinishReason.ERROR:
            # Only a request that cannot fit in the whole pool may fail.
            assert error is not None and "GPU pool holds only" in error, error
            assert len(prompt) + len(loop.tokens[rid]) + 1 > pool_tokens - BLOCK + 1
        else:
            assert (loop.tokens[rid], reason) == (tokens, expected_reason), rid
    alloc = loop.allocator
    assert not alloc.seqs, f"blocks still held by {sorted(alloc.seqs)}"
    assert alloc.gpu.num_free == alloc.gpu.num_blocks and alloc.cpu.num_free == alloc.cpu.num_blocks
    assert loop.runner.num_live <= len(w["reqs"])
    stats = loop.batches[-1].stats
    assert stats is not None and stats.num_gpu_blocks_used == 0 and stats.num_running == 0
    assert stats.num_gpu_blocks_cached == alloc.gpu.num_cached


_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(workloads())
def test_random_load_matches_unlimited_pool_auto(w: dict) -> None:
    _run(w, "auto")


@_settings
@given(workloads())
def test_random_load_matches_unlimited_pool_swap(w: dict) -> None:
    _run(w, "swap")


@_settings
@given(workloads())
def test_random_load_matches_unlimited_pool_recompute(w: dict) -> None:
    _run(w, "recompute")


@_settings
@given(workloads(), st.sampled_from(["auto", "swap", "recompute"]))
def test_random_refusals_lose_nothing(w: dict, mode: str) -> None:
    _run(w, mode, refusing=True)


@_settings
@given(workloads(), st.sampled_from(["auto", "recompute"]))
def test_random_load_with_the_cpu_tier_matches_unlimited_pool(w: dict, mode: str) -> None:
    """Evicted cached blocks move to a roomy CPU pool and come back on hits (the fake runner
    reads back every KV slot, so a wrong copy changes the tokens)."""
    _run({**w, "caching": True, "cpu_tier": True, "num_cpu_blocks": 64}, mode)
