"""A pool of KV blocks with reference counts and LRU eviction of cached free blocks.

    free        ref 0, not in the prefix cache         -> `_free` (a stack: LIFO)
    fresh       free and never handed out (warm_first) -> `_fresh` (a stack: 0, 1, 2, ... first)
    cached      ref 0, holds reusable prefix KV         -> `_lru` (oldest first; evicted on demand)
    owned       ref >= 1 (may also be in the cache)     -> shared by `ref` requests

LIFO keeps the blocks in use near those used before, so a pool committed page by page when first
written (the CPU pool) holds about as much memory as is live; released in reverse table order (as
the allocator does), a consecutive table stays so. Cached blocks are evicted only when no plain free
block is left. Never-used blocks are plain free blocks by default (GPU memory is committed at
allocation: the prefix cache may fill the pool); with `warm_first` (a pool committed as written: the
CPU) they come after every cached block, so the memory committed follows the most blocks ever owned
at once, at the price of a prefix cache no larger than that.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from troupe.actors.core.prefix_cache import CacheKey, PrefixCache


class BlockPool:
    """`num_blocks` blocks; `cache` is the prefix index of their contents."""

    def __init__(
        self,
        num_blocks: int,
        cache: PrefixCache,
        on_evict: Callable[[int, CacheKey, int], None] | None = None,  # (block id, key, serial)
        *,
        warm_first: bool = False,
    ) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks, self.cache = num_blocks, cache
        self.on_evict = on_evict  # told of each cached block evicted (the CPU tier keeps it)
        self.ref = [0] * num_blocks
        never_used = list(range(num_blocks - 1, -1, -1))  # pops 0, 1, 2, ... first
        self._free = [] if warm_first else never_used
        self._fresh = never_used if warm_first else []  # taken after every cached block
        self._lru: OrderedDict[int, None] = OrderedDict()

    @property
    def num_free(self) -> int:
        """Blocks not owned by any request (plain free plus evictable cached)."""
        return len(self._free) + len(self._lru) + len(self._fresh)

    @property
    def num_cached(self) -> int:
        return len(self._lru)

    def allocate(self, n: int) -> list[int] | None:
        """`n` blocks with ref 1, or None (nothing changes) when fewer are free."""
        free, lru, fresh = self._free, self._lru, self._fresh
        if n <= len(free):  # the common case: no eviction; the order pop() would give
            out = free[len(free) - n :]
            del free[len(free) - n :]
            out.reverse()
        elif n <= self.num_free:
            out = free[::-1]
            free.clear()
            while len(out) < n and lru:  # evict the oldest cached: the cache forgets it
                block_id, _ = lru.popitem(last=False)
                key, serial = self.cache.forget(block_id)
                if self.on_evict is not None:
                    self.on_evict(block_id, key, serial)
                out.append(block_id)
            while len(out) < n:
                out.append(fresh.pop())
        else:
            return None
        for block_id in out:
            self.ref[block_id] = 1
        return out

    def take(self, block_id: int) -> None:
        """One more reference to a block (a prefix-cache hit); revives it if it was cached."""
        if self.ref[block_id] == 0:
            if block_id not in self._lru:
                raise ValueError(f"block {block_id} is free and not cached; it cannot be shared")
            del self._lru[block_id]
        self.ref[block_id] += 1

    def drop_cached(self) -> int:
        """Forget every cached block (they become plain free blocks); how many there were."""
        dropped = list(self._lru)
        for block_id in dropped:
            self.cache.forget(block_id)
        self._free.extend(reversed(dropped))  # the oldest popped last
        self._lru.clear()
        return len(dropped)

    def release(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block, in the order given (the LRU keeps that order)."""
        ref, cache = self.ref, self.cache
        for block_id in block_ids:
            if ref[block_id] <= 0:
                raise ValueError(f"double free of block {block_id}")
            ref[block_id] -= 1
            if ref[block_id] == 0:
                if cache.is_cached(block_id):
                    self._lru[block_id] = None
                else:
                    self._free.append(block_id)
