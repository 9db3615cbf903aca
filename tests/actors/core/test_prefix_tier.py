"""The prefix cache's CPU tier: evicted cached GPU blocks move to the CPU pool and come back on a
hit. Scheduler + allocator + fake runner (which reads back every KV slot it attends to, so a
block copied to the wrong place changes the tokens)."""

from __future__ import annotations

from troupe.actors.core.allocator import AllocatorCore
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import AdmittedRequest, SamplingParams
from troupe.messages.allocator import AllocateBatch, AllocateNew, CacheBlocks, FreeRequest
from troupe.ops.bench_scheduler import CoreLoop, build_loop

from tests.actors.core.allocator_invariants import check_allocator

BLOCK = 4
SYSTEM = tuple(range(100, 132))  # a 32-token shared prefix (8 blocks)
TURN1, TURN2 = (*SYSTEM, 7, 8, 9), (*SYSTEM, 7, 8, 9, 11, 12)


def _admit(loop: CoreLoop, rid: str, prompt: tuple[int, ...]) -> None:
    params = SamplingParams(max_tokens=4, seed=1, ignore_eos=True)
    msg = AdmittedRequest(
        request_id=rid, prompt_token_ids=prompt, params=params, arrival_time=0.0,
        max_total_tokens=len(prompt) + 4,
    )  # fmt: skip
    loop.submit([msg])
    loop.run()


def _chat(tier: bool) -> tuple[CoreLoop, int]:
    """Turn 1 caches SYSTEM + question; an unrelated long prompt evicts it from the 12-block
    GPU pool; turn 2 repeats the prefix. Returns the loop and the prompt tokens computed."""
    loop = build_loop(
        block_size=BLOCK, num_gpu_blocks=12, num_cpu_blocks=32, max_num_seqs=4,
        max_num_batched_tokens=64, check=check_allocator, cpu_prefix_tier=tier,
    )  # fmt: skip
    _admit(loop, "turn1", TURN1)
    _admit(loop, "other", tuple(range(300, 344)))  # all 12 blocks: evicts every cached one
    _admit(loop, "turn2", TURN2)
    computed = sum(len(s.token_ids) for p in loop.plans for s in p.seqs if s.sample is not None)
    return loop, computed


def test_an_evicted_prefix_comes_back_from_the_cpu_tier() -> None:
    with_tier, computed_with = _chat(tier=True)
    without, computed_without = _chat(tier=False)
    for loop in (with_tier, without):
        for rid, prompt in (("turn1", TURN1), ("turn2", TURN2)):
            params = SamplingParams(max_tokens=4, seed=1, ignore_eos=True)
            assert loop.tokens[rid] == FakeRunner.reference_tokens(prompt, 4, params), rid
    stats_with, stats_without = with_tier.batches[-1].stats, without.batches[-1].stats
    assert stats_with is not None and stats_without is not None
    assert stats_without.prefix_cache_cpu_hit_tokens == 0
    assert stats_without.prefix_cache_hit_tokens == 0  # the GPU tier forgot it
    assert stats_with.prefix_cache_cpu_hit_tokens == 32  # SYSTEM's 8 blocks came back
    assert computed_with == computed_without - 32
    alloc = with_tier.allocator
    assert alloc.gpu.num_free == alloc.gpu.num_blocks and alloc.cpu.num_free == alloc.cpu.num_blocks


def test_copies_and_keys_move_between_tiers() -> None:
    alloc = AllocatorCore(block_size=4, num_gpu_blocks=4, num_cpu_blocks=8, cpu_prefix_tier=True)
    step = iter(range(1, 100))

    def apply(*ops: object) -> object:
        result = alloc.apply(AllocateBatch(step_id=next(step), ops=ops))  # type: ignore[arg-type]
        check_allocator(alloc)
        return result

    prompt = tuple(range(100, 109))
    first = apply(AllocateNew("a", prompt, 9)).grants[0].block_ids  # type: ignore[attr-defined]
    apply(CacheBlocks("a", prompt[:8]), FreeRequest("a"))
    evicting = apply(AllocateNew("b", tuple(range(200, 213)), 13))
    # both cached blocks were reused: each was copied out first, to its own CPU block
    assert sorted(g for g, _ in evicting.swap_out) == sorted(first[:2])  # type: ignore[attr-defined]
    apply(FreeRequest("b"))
    back = apply(AllocateNew("c", prompt, 9))
    grant = back.grants[0]  # type: ignore[attr-defined]
    assert grant.num_cached_tokens == 8 and back.prefix_cache_cpu_hit_tokens == 8  # type: ignore[attr-defined]
    cpu_of = {g: c for g, c in evicting.swap_out}  # type: ignore[attr-defined]
    # block i of c's table receives the CPU copy of block i of a's
    assert back.swap_in == tuple((cpu_of[first[i]], grant.block_ids[i]) for i in range(2))  # type: ignore[attr-defined]
    apply(FreeRequest("c"))
    again = apply(AllocateNew("d", prompt, 9))  # back in the GPU tier: a plain GPU hit
    assert again.grants[0].num_cached_tokens == 8 and again.swap_in == ()  # type: ignore[attr-defined]
