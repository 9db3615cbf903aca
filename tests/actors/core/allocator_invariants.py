"""Self-checks of the allocator's state, for tests: every block in exactly one state, reference
counts and sharing as the block tables say."""

from __future__ import annotations

from collections import Counter

from troupe.actors.core.allocator import AllocatorCore
from troupe.actors.core.block_pool import BlockPool


def check_pool(pool: BlockPool) -> None:
    """Each block free (or never used), cached (LRU) or owned, exactly once; every LRU block in
    the cache."""
    free, lru = set(pool._free) | set(pool._fresh), set(pool._lru)
    owned = {b for b, r in enumerate(pool.ref) if r > 0}
    assert len(free) == len(pool._free) + len(pool._fresh), "a block is twice in the free list"
    assert not (free & lru) and not (owned & (free | lru)), "a block is in two states"
    assert len(owned) + len(free) + len(lru) == pool.num_blocks, "blocks leaked"
    assert min(pool.ref, default=0) >= 0, "negative reference count"
    assert all(pool.cache.is_cached(b) for b in lru), "an LRU block is not in the cache"


def check_allocator(alloc: AllocatorCore) -> None:
    """Pool invariants, and reference counts, holders and num_shared as the tables say."""
    check_pool(alloc.gpu)
    check_pool(alloc.cpu)
    refs, cpu_refs = [0] * alloc.gpu.num_blocks, [0] * alloc.cpu.num_blocks
    holders: dict[int, list[str]] = {}
    for rid, seq in alloc.seqs.items():
        for b in seq.held():  # the others were released behind a window
            refs[b] += 1
            holders.setdefault(b, []).append(rid)
        for b in seq.cpu_blocks or ():
            cpu_refs[b] += 1
    assert refs == alloc.gpu.ref, "GPU reference counts disagree with the block tables"
    assert cpu_refs == alloc.cpu.ref, "CPU reference counts disagree with the swapped tables"
    for b, names in alloc.sharing.holders.items():
        assert Counter(names) == Counter(holders.get(b, ())), f"block {b} held by {names}"
    for b in alloc.cache._entry_of:
        if refs[b]:
            assert b in alloc.sharing.holders, f"cached block {b} is held but has no holders entry"
    for rid, seq in alloc.seqs.items():
        num_shared = sum(1 for b in seq.held() if refs[b] > 1)
        counted = alloc.sharing.count(rid)
        assert counted == num_shared, f"{rid} shares {num_shared}, not {counted}"
