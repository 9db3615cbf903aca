"""BlockPool's allocation order: warm (freed) blocks first, then cached ones evicted, and
never-used blocks before eviction (GPU) or after it (warm_first: a pool committed as written)."""

from __future__ import annotations

from troupe.actors.core.block_pool import BlockPool
from troupe.actors.core.prefix_cache import ROOT_SERIAL, PrefixCache

from .allocator_invariants import check_pool


def _cached(pool: BlockPool, block_ids: list[int]) -> None:
    """Register each block as a cached prefix, then release it (it goes to the LRU)."""
    for i, block_id in enumerate(block_ids):
        pool.cache.register(block_id, ROOT_SERIAL, (i,))
    pool.release(block_ids)


def test_default_takes_never_used_blocks_before_evicting_cached_ones() -> None:
    pool = BlockPool(6, PrefixCache())
    _cached(pool, pool.allocate(2) or [])  # blocks 0, 1 cached
    assert pool.allocate(3) == [2, 3, 4]
    assert pool.num_cached == 2
    assert pool.allocate(2) == [5, 0]  # the last fresh block, then the oldest cached
    assert pool.num_cached == 1 and not pool.cache.is_cached(0)
    check_pool(pool)


def test_warm_first_evicts_cached_blocks_before_touching_never_used_ones() -> None:
    evicted: list[int] = []
    pool = BlockPool(6, PrefixCache(), lambda b, key, serial: evicted.append(b), warm_first=True)
    assert pool.num_free == 6
    first = pool.allocate(2)
    assert first == [0, 1]  # never-used blocks in order while nothing else is free
    _cached(pool, first)
    plain = pool.allocate(1)
    assert plain == [0]  # the oldest cached block is evicted: block 2 stays untouched
    assert evicted == [0] and pool.num_cached == 1
    pool.release(plain)  # back plain (its cache entry is gone)
    assert pool.allocate(3) == [0, 1, 2]  # plain free, then cached, then never used
    assert evicted == [0, 1]
    assert pool.num_free == 3
    check_pool(pool)


def test_warm_first_touches_no_more_blocks_than_owned_at_once() -> None:
    """Requests of 3 blocks, one at a time, each cached when done: a default pool hands out
    every block of the pool; warm_first only the 3 it needs."""
    for warm_first, touched in ((False, 12), (True, 3)):
        pool = BlockPool(12, PrefixCache(), warm_first=warm_first)
        seen: set[int] = set()
        for request in range(8):
            blocks = pool.allocate(3)
            assert blocks is not None
            seen.update(blocks)
            for i, block_id in enumerate(blocks):  # distinct prefixes: all cached
                pool.cache.register(block_id, ROOT_SERIAL, (request, i))
            pool.release(reversed(blocks))
            check_pool(pool)
        assert len(seen) == touched


def test_refusal_evicts_nothing() -> None:
    pool = BlockPool(4, PrefixCache(), warm_first=True)
    _cached(pool, pool.allocate(2) or [])  # 0, 1 cached; 2, 3 never used
    assert pool.allocate(5) is None
    assert pool.num_free == 4 and pool.num_cached == 2
    assert pool.cache.is_cached(0) and pool.cache.is_cached(1)
    assert pool.allocate(4) == [0, 1, 2, 3]
    check_pool(pool)
