"""The engine's calls in the cores (actors/core/engine_calls.py): DropCachedBlocks in the
allocator (exact counts in both tiers; blocks requests hold keep their entries), and the
scheduler's side of a prefix-cache reset and a weight update (scheduler + allocator + fake
runner, the update answered by the harness): requests in flight end first, newer ones are held
and then run without the old prefix, a held request can be aborted, a second update is BUSY."""

from __future__ import annotations

from troupe.actors.core.allocator import AllocatorCore
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import AbortRequest, AdmittedRequest, FinishReason, SamplingParams
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    CacheBlocks,
    DropCachedBlocks,
    FreeRequest,
)
from troupe.messages.engine_calls import (
    CacheDropped,
    PrefixCacheReset,
    ResetPrefixCache,
    UpdateWeights,
    WeightsErrorCode,
    WeightsUpdated,
)
from troupe.ops.bench_scheduler import CoreLoop, build_loop

from tests.actors.core.allocator_invariants import check_allocator

BLOCK = 4
PROMPT = tuple(range(10, 23))  # 13 tokens: 3 full blocks
MAX_TOKENS = 4


def _batch(step_id: int, *ops: object) -> AllocateBatch:
    return AllocateBatch(step_id=step_id, ops=tuple(ops))  # type: ignore[arg-type]


def test_drop_cached_blocks_forgets_both_tiers_and_keeps_held_entries() -> None:
    alloc = AllocatorCore(
        block_size=BLOCK, num_gpu_blocks=8, num_cpu_blocks=8, cpu_prefix_tier=True
    )
    cached, held = tuple(range(100, 112)), tuple(range(200, 208))
    alloc.apply(_batch(1, AllocateNew("c", cached, 12), CacheBlocks("c", cached)))
    alloc.apply(_batch(2, FreeRequest("c"), AllocateNew("h", held, 8), CacheBlocks("h", held)))
    assert (alloc.gpu.num_cached, alloc.cpu.num_cached) == (3, 0)
    # 4 blocks for "big": the 3 plain free ones, then the oldest cached moves to the CPU tier
    alloc.apply(_batch(3, AllocateNew("big", tuple(range(300, 316)), 16)))
    assert (alloc.gpu.num_cached, alloc.cpu.num_cached) == (2, 1)
    result = alloc.apply(_batch(4, DropCachedBlocks()))
    assert result.cache_dropped == CacheDropped(num_gpu_blocks=2, num_cpu_blocks=1)
    assert (alloc.gpu.num_cached, alloc.cpu.num_cached) == (0, 0)
    assert alloc.gpu.num_free == 2 and alloc.cpu.num_free == 8  # dropped: plain free blocks
    check_allocator(alloc)
    # "h" holds its blocks: their entries stay; "c"'s are gone from both tiers
    again = alloc.apply(
        _batch(5, FreeRequest("big"), AllocateNew("h2", held, 8), AllocateNew("c2", cached, 12))
    )
    assert [g.num_cached_tokens for g in again.grants] == [4, 0]
    assert again.cache_dropped is None
    check_allocator(alloc)


def _admit(rid: str, prompt: tuple[int, ...] = PROMPT) -> AdmittedRequest:
    params = SamplingParams(max_tokens=MAX_TOKENS, seed=1, ignore_eos=True)
    return AdmittedRequest(
        request_id=rid, prompt_token_ids=prompt, params=params, arrival_time=0.0,
        max_total_tokens=len(prompt) + MAX_TOKENS,
    )  # fmt: skip


def _loop() -> CoreLoop:
    return build_loop(
        block_size=BLOCK, num_gpu_blocks=32, num_cpu_blocks=8, max_num_seqs=4,
        max_num_batched_tokens=64, check=check_allocator,
    )  # fmt: skip


def _expected() -> list[int]:
    params = SamplingParams(max_tokens=MAX_TOKENS, seed=1, ignore_eos=True)
    return FakeRunner.reference_tokens(PROMPT, MAX_TOKENS, params)


def _steps_of(loop: CoreLoop, rid: str) -> list[int]:
    return [i for i, plan in enumerate(loop.plans) if any(s.request_id == rid for s in plan.seqs)]


def test_an_update_waits_for_requests_in_flight_and_holds_newer_ones() -> None:
    loop = _loop()
    loop.submit([_admit("r1")])
    # the update lands while r1 runs, r2 (the same prompt) while the update waits
    loop.run(inject={1: [UpdateWeights(call_id=7, model_path="/b")], 2: [_admit("r2")]})
    assert loop.tokens["r1"] == loop.tokens["r2"] == _expected()
    assert max(_steps_of(loop, "r1")) < min(_steps_of(loop, "r2"))  # never in one step
    [reply] = loop.replies
    assert isinstance(reply, WeightsUpdated) and reply.success and reply.call_id == 7
    # r1's 16 tokens computed (13 + 3): 4 full blocks, freed and dropped in the update's batch
    assert reply.dropped == CacheDropped(num_gpu_blocks=4, num_cpu_blocks=0)
    assert reply.num_paused_requests == 1
    assert loop.batches[-1].stats is not None
    assert loop.batches[-1].stats.prefix_cache_hit_tokens == 0  # r2 did not reuse r1's KV


def test_a_held_request_can_be_aborted_and_a_second_update_is_busy() -> None:
    loop = _loop()
    loop.submit([_admit("r1")])
    loop.run(
        inject={
            1: [UpdateWeights(call_id=1, model_path="/b")],
            2: [_admit("r2"), UpdateWeights(call_id=2, model_path="/c")],
            3: [AbortRequest(request_id="r2", reason="gone")],
        }
    )
    assert loop.finished["r2"] == [(FinishReason.ABORT, "gone")]
    assert loop.tokens["r2"] == [] and not _steps_of(loop, "r2")
    busy, done = loop.replies
    assert isinstance(busy, WeightsUpdated) and busy.call_id == 2
    assert busy.error == WeightsErrorCode.BUSY and "weight update 1" in busy.message
    assert isinstance(done, WeightsUpdated) and done.success and done.num_paused_requests == 0


def test_a_reset_drops_cached_blocks_while_a_request_runs() -> None:
    loop = _loop()
    loop.submit([_admit("r0", tuple(range(50, 63)))])
    loop.run()  # r0: 4 full blocks, cached once freed
    loop.submit([_admit("r1")])
    start = loop._num_deliveries  # r1 holds its blocks from this delivery's batch on
    loop.run(inject={start + 2: [ResetPrefixCache(call_id=3), ResetPrefixCache(call_id=4)]})
    assert loop.tokens["r1"] == _expected()
    [reply] = loop.replies
    assert isinstance(reply, PrefixCacheReset) and reply.call_ids == (3, 4)
    assert reply.dropped == CacheDropped(num_gpu_blocks=4, num_cpu_blocks=0)
    assert loop.allocator.gpu.num_cached == 4  # r1's own blocks, cached after it ended
