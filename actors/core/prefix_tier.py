"""The prefix cache's CPU tier: cached GPU blocks that are evicted move to the CPU pool instead of
being forgotten, and come back on a prefix hit instead of being recomputed.

An entry keeps its key and serial when it moves between tiers, so the chain of keys stays valid
across them (a GPU child of a CPU parent is found by walking both). Its CPU blocks share the
pool with swapping: they are cached free blocks there, evicted (oldest first) when a swap-out
or a newer entry needs room. Copies ride the swap path: the executor copies GPU to CPU before
CPU to GPU, both before the step computes, so an evicted GPU block is read before its new owner
writes it.

    GPU evicts b7 (key K, serial 9)   copy b7 -> c3, K now names c3 in the CPU index
    a prompt hits K                   c3 -> fresh GPU b2, K names b2 in the GPU index again
"""

from __future__ import annotations

from troupe.actors.core.block_pool import BlockPool
from troupe.actors.core.prefix_cache import CacheKey, PrefixCache


class CpuPrefixTier:
    def __init__(self, cpu: BlockPool, *, enabled: bool) -> None:
        self.cpu, self.enabled = cpu, enabled
        self.copies_out: list[tuple[int, int]] = []  # this batch's (gpu, cpu) copies
        self.copies_in: list[tuple[int, int]] = []  # this batch's (cpu, gpu) copies
        self.hit_tokens = 0  # cumulative prompt tokens served from this tier
        self._held: list[int] = []  # CPU blocks this batch writes or reads: kept until it ends

    def evicted(self, gpu_block: int, key: CacheKey, serial: int) -> None:
        """A cached GPU block is being reused: keep its KV here if there is room."""
        cache = self.cpu.cache
        if not self.enabled or cache.lookup(*key) is not None:
            return
        got = self.cpu.allocate(1)  # may evict this tier's oldest entry
        if got is None:
            return
        cache.register(got[0], key[0], key[1], serial)
        self.copies_out.append((gpu_block, got[0]))
        self._held += got

    def walk(
        self, gpu: PrefixCache, token_ids: tuple[int, ...], block_size: int, root: int
    ) -> tuple[list[tuple[int, bool]], int]:
        """The longest cached prefix of whole blocks (never the last token: it must be computed
        to give logits), across both tiers: [(block, whether in this tier)], its last serial.
        The chain starts at `root`: the request's namespace's (`gpu.root`; an entry keeps its
        serial in either tier), itself the last serial when nothing hits."""
        hits: list[tuple[int, bool]] = []
        serial, bs, cpu = root, block_size, self.cpu.cache
        for i in range((len(token_ids) - 1) // bs):
            chunk = token_ids[i * bs : (i + 1) * bs]
            block_id = gpu.lookup(serial, chunk)
            on_cpu = block_id is None and self.enabled
            if on_cpu:
                block_id = cpu.lookup(serial, chunk)
            if block_id is None:
                break
            hits.append((block_id, on_cpu))
            serial = cpu.serial(block_id) if on_cpu else gpu.serial(block_id)
        return hits, serial

    def take(self, cpu_block: int) -> tuple[CacheKey, int]:
        """A hit: its entry (key, serial) leaves this tier, to move back to a GPU block (the
        caller adds the copy); the block is held while the batch reads it, never evicted."""
        self.cpu.take(cpu_block)
        self._held.append(cpu_block)
        return self.cpu.cache.forget(cpu_block)

    def bring_back(
        self, cpu_block: int, entry: tuple[CacheKey, int], gpu_block: int, gpu: PrefixCache
    ) -> int:
        """A taken hit's entry, registered again for `gpu_block`, which its KV is copied to."""
        (parent, token_ids), serial = entry
        gpu.register(gpu_block, parent, token_ids, serial)
        self.copies_in.append((cpu_block, gpu_block))
        return gpu_block

    def drop(self) -> int:
        """Forget every entry of this tier; how many. Entries this batch moved here are
        forgotten too (their copies still run, into blocks that are then plain free ones)."""
        cache = self.cpu.cache
        moved = [cpu for _, cpu in self.copies_out if cache.is_cached(cpu)]
        for cpu_block in moved:
            cache.forget(cpu_block)
        return self.cpu.drop_cached() + len(moved)

    def end_batch(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """This batch's copies (out, in); its blocks go back to the pool (entries: cached)."""
        copies = self.copies_out, self.copies_in
        self.cpu.release(self._held)
        self.copies_out, self.copies_in, self._held = [], [], []
        return copies
