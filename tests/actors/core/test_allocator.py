"""Exact tests of the allocator core: which blocks, which order, which denial."""

from __future__ import annotations

import pytest
from troupe.actors.core.allocator import AllocatorCore
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    CacheBlocks,
    FreeRequest,
    Grow,
    SwapIn,
    SwapOut,
)
from troupe.messages.scheduler import AllocationResult, Grant, Refusal, RefusalReason

from tests.actors.core.allocator_invariants import check_allocator

BS = 4
NO_GPU, NO_CPU = RefusalReason.NO_GPU_BLOCKS, RefusalReason.NO_CPU_BLOCKS


def make(num_gpu: int = 8, num_cpu: int = 4, caching: bool = True) -> AllocatorCore:
    return AllocatorCore(
        block_size=BS,
        num_gpu_blocks=num_gpu,
        num_cpu_blocks=num_cpu,
        enable_prefix_caching=caching,
    )


def apply(alloc: AllocatorCore, *ops: object, step_id: int = 1) -> AllocationResult:
    result = alloc.apply(AllocateBatch(step_id=step_id, ops=tuple(ops)))  # type: ignore[arg-type]
    check_allocator(alloc)
    return result


def test_allocate_grow_free_counts() -> None:
    alloc = make()
    res = apply(alloc, AllocateNew("a", tuple(range(10, 16)), 6), AllocateNew("b", (1, 2, 3), 3))
    assert res.grants == (Grant("a", (0, 1), 0), Grant("b", (2,), 0))
    assert (res.num_gpu_free, res.num_gpu_cached, res.refused) == (5, 0, ())
    res = apply(alloc, Grow("a", 8), Grow("a", 9), Grow("b", 3))
    assert res.grants == (Grant("a", ()), Grant("a", (3,)), Grant("b", ()))
    assert alloc.seqs["a"].table == [0, 1, 3]
    res = apply(alloc, FreeRequest("a"), FreeRequest("b"))
    assert (res.num_gpu_free, res.num_gpu_cached) == (8, 0)  # nothing registered: plain free
    # Plain free blocks are reused most recently freed first (LIFO): b's, then a's, which were
    # released tail first and so come back in a's table order; the untouched 4..7 last.
    res = apply(alloc, AllocateNew("c", tuple(range(32)), 32))
    assert res.grants == (Grant("c", (2, 0, 1, 3, 4, 5, 6, 7), 0),)


def test_blocks_touched_stay_within_the_peak_of_live_blocks() -> None:
    """LIFO reuse: over many requests without caching, no block beyond the most ever held at
    once is handed out (a pool committed page by page, the CPU's, stays that small)."""
    alloc = make(num_gpu=64, num_cpu=0, caching=False)
    touched: set[int] = set()
    peak = 0
    for i in range(30):
        sizes = {"a": 3 + i % 5, "b": 1 + (i * 7) % 9}
        for rid, blocks in sizes.items():
            res = apply(alloc, AllocateNew(rid, tuple(range(blocks * BS)), blocks * BS))
            touched.update(res.grants[0].block_ids)
        res = apply(alloc, Grow("a", sizes["a"] * BS + 1))
        touched.update(res.grants[0].block_ids)
        peak = max(peak, sum(len(seq.table) for seq in alloc.seqs.values()))
        apply(alloc, FreeRequest("b"), FreeRequest("a"))
    assert peak < 64 and touched == set(range(peak))


def test_chunked_new_request_covers_only_its_chunk() -> None:
    alloc = make()
    res = apply(alloc, AllocateNew("a", tuple(range(100, 120)), 5))
    assert res.grants == (Grant("a", (0, 1), 0),)


def test_prefix_hit_shares_blocks_and_never_serves_the_last_token() -> None:
    alloc = make()
    prompt = tuple(range(100, 112))  # exactly 3 blocks
    apply(alloc, AllocateNew("a", prompt, 12))
    apply(alloc, CacheBlocks("a", prompt))
    res = apply(alloc, AllocateNew("b", prompt, 12))
    # Blocks 0 and 1 are shared; the block with the last token is recomputed in a fresh block.
    assert res.grants == (Grant("b", (0, 1, 3), 8),)
    assert alloc.gpu.ref[:4] == [2, 2, 1, 1]
    res = apply(alloc, AllocateNew("c", (*prompt[:5], 999, 998), 7))
    assert res.grants == (Grant("c", (0, 4), 4),)
    assert (res.prefix_cache_hit_tokens, res.prefix_cache_query_tokens) == (12, 31)


def test_same_tokens_after_a_different_prefix_do_not_hit() -> None:
    alloc = make()
    apply(alloc, AllocateNew("a", (1, 2, 3, 4, 5, 6, 7, 8, 9), 9))
    apply(alloc, CacheBlocks("a", (1, 2, 3, 4, 5, 6, 7, 8)))
    # Second block's tokens equal, first block differs: the chain must not match.
    res = apply(alloc, AllocateNew("b", (9, 9, 9, 9, 5, 6, 7, 8, 9), 9))
    assert res.grants[0].num_cached_tokens == 0
    # A block whose parent matches but whose own tokens differ does not hit either.
    res = apply(alloc, AllocateNew("c", (1, 2, 3, 4, 5, 6, 7, 0, 9), 9))
    assert res.grants[0].num_cached_tokens == 4


def test_freed_cached_blocks_are_evicted_lru_and_revived_by_hits() -> None:
    alloc = make(num_gpu=4)
    apply(alloc, AllocateNew("a", (1, 2, 3, 4, 5), 5), AllocateNew("b", (6, 7, 8, 9, 5), 5))
    apply(alloc, CacheBlocks("a", (1, 2, 3, 4)), CacheBlocks("b", (6, 7, 8, 9)))
    res = apply(alloc, FreeRequest("a"), FreeRequest("b"))
    assert (res.num_gpu_free, res.num_gpu_cached) == (4, 2)
    # a's block 0 was freed first, so it is the oldest; a hit on it revives it instead, and
    # c's second block is a plain free one (b's cached block 2 stays cached).
    res = apply(alloc, AllocateNew("c", (1, 2, 3, 4, 0), 5))
    (c,) = res.grants
    assert c.block_ids[0] == 0 and c.block_ids[1] in (1, 3) and c.num_cached_tokens == 4
    assert alloc.gpu.num_cached == 1
    res = apply(alloc, AllocateNew("d", (42,) * 12, 12))  # needs 3, only 2 allocatable
    assert res.refused == (Refusal("d", NO_GPU),) and alloc.gpu.num_cached == 1
    res = apply(alloc, AllocateNew("d", (42,) * 8, 8))  # the last plain free one, then evicts 2
    (free_one,) = {1, 3} - set(c.block_ids)
    assert res.grants == (Grant("d", (free_one, 2)),)
    assert alloc.cache is not None and alloc.cache.lookup(0, (6, 7, 8, 9)) is None  # evicted


def test_denial_leaves_everything_unchanged() -> None:
    alloc = make(num_gpu=2)
    res = apply(alloc, AllocateNew("a", tuple(range(12)), 12), AllocateNew("b", (1,), 1))
    assert res.refused == (Refusal("a", NO_GPU),) and res.grants == (Grant("b", (0,)),)
    assert "a" not in alloc.seqs
    res = apply(alloc, Grow("b", 12))
    assert res.refused == (Refusal("b", NO_GPU),) and alloc.seqs["b"].table == [0]


def test_swap_out_and_in_copy_lists() -> None:
    alloc = make(num_gpu=6, num_cpu=3)
    apply(alloc, AllocateNew("a", tuple(range(10)), 10), AllocateNew("b", (1, 2), 2))
    res = apply(alloc, SwapOut("a"))
    assert res.swap_out == ((0, 0), (1, 1), (2, 2))
    assert (res.num_gpu_free, res.num_cpu_free) == (5, 0)
    res = apply(alloc, SwapOut("b"))  # no CPU room: freed instead, for recompute
    assert res.refused == (Refusal("b", NO_CPU),) and "b" not in alloc.seqs
    res = apply(alloc, SwapIn("a", 13))
    # a's three CPU blocks are copied into the first three blocks of its new four-block table.
    (grant,) = res.grants
    assert grant.request_id == "a" and len(set(grant.block_ids)) == 4
    assert res.swap_in == tuple(zip((0, 1, 2), grant.block_ids[:3], strict=True))
    assert (res.num_gpu_free, res.num_cpu_free) == (2, 3)


def test_cpu_blocks_read_by_swap_in_are_not_reused_in_the_same_batch() -> None:
    alloc = make(num_gpu=4, num_cpu=2)
    apply(alloc, AllocateNew("a", (1, 2, 3, 4, 5), 5), AllocateNew("b", (6, 7, 8), 3))
    apply(alloc, SwapOut("a"))
    res = apply(alloc, SwapIn("a"), SwapOut("b"))
    # b cannot take a's CPU blocks in this batch: the executor copies out before in.
    assert res.refused == (Refusal("b", NO_CPU),) and [c for c, _ in res.swap_in] == [0, 1]
    assert list(alloc.seqs["a"].table) == [g for _, g in res.swap_in]
    assert res.num_cpu_free == 2


def test_misuse_raises_value_error() -> None:
    alloc = make()
    apply(alloc, AllocateNew("a", (1, 2, 3), 3))
    with pytest.raises(ValueError, match="already holds"):
        apply(alloc, AllocateNew("a", (1, 2, 3), 3))
    with pytest.raises(ValueError, match="unknown request 'x'"):
        apply(alloc, Grow("x", 4))
    with pytest.raises(ValueError, match="multiple of block_size"):
        apply(alloc, CacheBlocks("a", (1, 2, 3)))
    with pytest.raises(ValueError, match="not swapped out"):
        apply(alloc, SwapIn("a"))
    apply(alloc, FreeRequest("a"))
    with pytest.raises(ValueError, match="double free"):
        apply(alloc, FreeRequest("a"))
    with pytest.raises(ValueError, match="double free of block 0"):
        alloc.gpu.release([0])


def test_handle_answers_each_batch() -> None:
    alloc = make()
    out = alloc.handle([AllocateBatch(step_id=7, ops=(AllocateNew("a", (1,), 1),))])
    assert out == [
        (
            "scheduler",
            AllocationResult(
                step_id=7,
                grants=(Grant("a", (0,)),),
                num_gpu_free=7,
                num_cpu_free=4,
                prefix_cache_query_tokens=1,
            ),
        )
    ]


def test_caching_off_never_hits() -> None:
    alloc = make(caching=False)
    apply(alloc, AllocateNew("a", tuple(range(9)), 9))
    apply(alloc, CacheBlocks("a", tuple(range(8))), FreeRequest("a"))
    res = apply(alloc, AllocateNew("b", tuple(range(9)), 9))
    assert res.grants[0].num_cached_tokens == 0 and res.num_gpu_cached == 0


def test_prefix_cache_register_keeps_the_first_writer_and_rejects_a_reused_block() -> None:
    from troupe.actors.core.prefix_cache import ROOT_SERIAL, PrefixCache

    cache = PrefixCache()
    s1 = cache.register(3, ROOT_SERIAL, (1, 2))
    assert cache.register(3, ROOT_SERIAL, (1, 2)) == s1  # same block, same prefix: no-op
    assert cache.register(7, ROOT_SERIAL, (1, 2)) == s1  # another block: first writer wins
    assert not cache.is_cached(7) and cache.lookup(ROOT_SERIAL, (1, 2)) == 3
    with pytest.raises(ValueError, match="block 3 is already registered"):
        cache.register(3, s1, (5, 6))
    assert cache.lookup(s1, (5, 6)) is None and len(cache._index) == 1  # the failed insert undone
    cache.forget(3)
    assert not cache._index and not cache.is_cached(3)


def test_shared_counts_follow_hits_and_releases() -> None:
    alloc = make(num_gpu=8)
    prompt = tuple(range(100, 109))  # two full blocks and one token
    apply(alloc, AllocateNew("a", prompt, 9))
    res = apply(alloc, CacheBlocks("a", prompt[:8]))
    assert res.shared == ()  # registered, but a holds them alone
    res = apply(alloc, AllocateNew("b", prompt, 9))
    # b hit a's two blocks: both now hold two blocks that the other holds too
    assert res.grants == (Grant("b", (0, 1, 3), 8),) and res.shared == (("a", 2), ("b", 2))
    res = apply(alloc, AllocateNew("c", (*prompt[:4], 7, 7, 7, 7, 7), 9))
    assert res.shared == (("c", 1),)  # block 0 had two holders already: only c's count moves
    res = apply(alloc, FreeRequest("a"))
    assert res.shared == (("b", 1),)  # block 1 is b's alone now; block 0 still has b and c
    res = apply(alloc, SwapOut("b"), Grow("c", 12))
    assert res.shared == (("c", 0),) and res.num_gpu_free == 8 - 3  # only c's 3 blocks held


def test_freeing_a_request_frees_at_least_its_unshared_blocks() -> None:
    alloc = make(num_gpu=8)
    prompt = tuple(range(100, 113))
    apply(alloc, AllocateNew("a", prompt, 13))
    apply(alloc, CacheBlocks("a", prompt[:12]))
    res = apply(alloc, AllocateNew("b", prompt, 13))
    held = {rid: (len(seq.table), alloc.sharing.count(rid)) for rid, seq in alloc.seqs.items()}
    assert held == {"a": (4, 3), "b": (4, 3)} and res.num_gpu_free == 3
    res = apply(alloc, FreeRequest("b"))
    assert res.num_gpu_free == 3 + (4 - 3) and res.shared == (("a", 0),)
