"""Allocator core: the only owner of block ids, reference counts, the prefix-cache index and the
LRU of cached free blocks. Answers each AllocateBatch with one AllocationResult, whose counts
(free blocks; per request, how many of its blocks others hold too) the scheduler plans with."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from troupe.actors.core.base import Outgoing
from troupe.actors.core.block_fork import fork_tables
from troupe.actors.core.block_pool import BlockPool
from troupe.actors.core.block_sharing import BlockSharing
from troupe.actors.core.block_table import BlockTable
from troupe.actors.core.prefix_cache import ROOT_SERIAL, PrefixCache
from troupe.actors.core.prefix_tier import CpuPrefixTier
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    CacheBlocks,
    DropCachedBlocks,
    Fork,
    FreeRequest,
    Grow,
    ReleaseBlocks,
    Shrink,
    SwapIn,
    SwapOut,
)
from troupe.messages.engine_calls import CacheDropped
from troupe.messages.scheduler import AllocationResult, Grant, Refusal, RefusalReason


class AllocatorCore:
    """Inbox: AllocateBatch. Outbox: "scheduler" (AllocationResult). Ops apply in the order sent
    (queue order), so a shortage lands on the last: a Refusal (the request unchanged; a refused
    SwapOut frees it). Misuse raises ValueError."""

    def __init__(
        self,
        *,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        enable_prefix_caching: bool = True,
        cpu_prefix_tier: bool = False,
        warm_first: bool = False,  # the pool is committed as written (CPU): see BlockPool
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.cache = PrefixCache()
        self.registry = self.cache if enable_prefix_caching else None  # None: off, nothing hits
        self.cpu = BlockPool(num_cpu_blocks, PrefixCache())
        self.tier = CpuPrefixTier(self.cpu, enabled=cpu_prefix_tier and enable_prefix_caching)
        self.gpu = BlockPool(num_gpu_blocks, self.cache, self.tier.evicted, warm_first=warm_first)
        self.seqs: dict[str, BlockTable] = {}
        self.sharing = BlockSharing()  # who holds the blocks that can be shared
        # this batch's answers, and its (gpu, cpu), (cpu, gpu) and (gpu, gpu: a Fork's) copies
        self._grants: list[Grant] = []
        self._refused: list[Refusal] = []
        self._copies_out: list[tuple[int, int]] = []
        self._copies_in: list[tuple[int, int]] = []
        self._copies: list[tuple[int, int]] = []
        self.prefix_cache_hit_tokens = self.prefix_cache_query_tokens = 0
        self._ops: dict[type, Callable[[Any], None]] = {  # each records its answer, if any
            Grow: self._grow,
            CacheBlocks: self._cache_blocks,
            FreeRequest: lambda op: self._free(op.request_id),
            Shrink: self._shrink,
            ReleaseBlocks: self._release_leading,
            SwapOut: self._swap_out,
            SwapIn: self._swap_in,
            AllocateNew: self._allocate_new,
            Fork: self._fork,
            DropCachedBlocks: self._drop_cached,
        }
        self._dropped: CacheDropped | None = None  # this batch's DropCachedBlocks answer

    def handle(self, batch: Sequence[AllocateBatch]) -> Outgoing:
        return [("scheduler", self.apply(msg)) for msg in batch]

    def apply(self, batch: AllocateBatch) -> AllocationResult:
        self._grants, self._refused = [], []
        self._copies_out, self._copies_in, self._copies = [], [], []
        self._dropped = None
        for op in batch.ops:
            if (handler := self._ops.get(type(op))) is None:
                raise ValueError(f"unknown allocator op {op!r}")
            handler(op)
        # CPU blocks read by this step's swap-ins must not be rewritten by its swap-outs (the
        # executor copies out before in), so they return to the pool only after the batch.
        self.cpu.release(cpu for cpu, _ in self._copies_in)
        tier_out, tier_in = self.tier.end_batch()
        return AllocationResult(
            step_id=batch.step_id,
            grants=tuple(self._grants),
            refused=tuple(self._refused),
            shared=self.sharing.take_changes(self.seqs),
            swap_out=tuple(self._copies_out + tier_out),
            swap_in=tuple(self._copies_in + tier_in),
            copy_blocks=tuple(self._copies),
            num_gpu_free=self.gpu.num_free,
            num_gpu_cached=self.gpu.num_cached,
            num_cpu_free=self.cpu.num_free,
            prefix_cache_hit_tokens=self.prefix_cache_hit_tokens,
            prefix_cache_query_tokens=self.prefix_cache_query_tokens,
            prefix_cache_cpu_hit_tokens=self.tier.hit_tokens,
            cache_dropped=self._dropped,
        )

    def _seq(self, request_id: str, swapped: bool | None = False) -> BlockTable:
        """The request's blocks; `swapped`: whether it must be swapped out (None: either)."""
        if (seq := self.seqs.get(request_id)) is None:
            raise ValueError(f"allocator: unknown request {request_id!r} (double free?)")
        if swapped is not None and (seq.cpu_blocks is not None) is not swapped:
            state = "is swapped out" if seq.cpu_blocks is not None else "is not swapped out"
            raise ValueError(f"allocator: request {request_id!r} {state}")
        return seq

    def _allocate_new(self, op: AllocateNew) -> None:
        """Its longest cached prefix in its namespace (prefix_tier.walk), then blocks for
        num_new_tokens more. Its table chains what it registers from the same root."""
        rid, token_ids, bs, cache = op.request_id, op.token_ids, self.block_size, self.cache
        if rid in self.seqs:
            raise ValueError(f"allocator: request {rid!r} already holds blocks")
        if op.num_new_tokens < 1 or not token_ids:
            raise ValueError(f"allocator: AllocateNew of {rid!r} needs tokens, got {op}")
        # its namespace's chains only (prefix_cache.py); caching off: nothing is registered
        root = cache.root(op.namespace) if self.registry is not None else ROOT_SERIAL
        # (block, whether in the CPU tier) for each block hit; cache_limit 0: no limit
        hits, serial = self.tier.walk(cache, token_ids[: op.cache_limit or None], bs, root)
        num_cached = len(hits) * bs
        need = -(-min(len(token_ids), num_cached + op.num_new_tokens) // bs) - len(hits)
        # each CPU hit needs a GPU block, and cached-free GPU hits use up free blocks
        if need + sum(on_cpu or self.gpu.ref[b] == 0 for b, on_cpu in hits) > self.gpu.num_free:
            self._refused.append(Refusal(rid, RefusalReason.NO_GPU_BLOCKS))
            return
        seq = self.seqs[rid] = BlockTable(num_hashed_blocks=len(hits), serial=serial)
        moved = [(b, self.tier.take(b)) for b, on_cpu in hits if on_cpu]  # first: allocating evicts
        for block_id, on_cpu in hits:
            if not on_cpu:
                self.sharing.hold(block_id, rid)
                self.gpu.take(block_id)
        fresh = self.gpu.allocate(need + len(moved))
        assert fresh is not None, "checked above"
        gpu_of = {b: self.tier.bring_back(b, entry, fresh.pop(), cache) for b, entry in moved}
        for gpu_block in gpu_of.values():  # back in the GPU tier under the same key
            self.sharing.register(gpu_block, rid)
        seq.table = [gpu_of[b] if on_cpu else b for b, on_cpu in hits] + fresh
        self.prefix_cache_query_tokens += len(token_ids)
        self.prefix_cache_hit_tokens += num_cached
        self.tier.hit_tokens += len(moved) * bs
        self._grants.append(Grant(rid, tuple(seq.table), num_cached))

    def _fork(self, op: Fork) -> None:  # block_fork.py
        parent, bs = self._seq(op.request_id), self.block_size
        grants, copies = fork_tables(op, parent, self.seqs, self.gpu, self.sharing, bs)
        self._grants += grants
        self._copies += copies

    def _grow(self, op: Grow) -> None:  # grant: the added blocks
        seq = self._seq(op.request_id)
        need = -(-op.num_tokens // self.block_size) - len(seq.table)
        added = self.gpu.allocate(need) if need > 0 else []
        if added is None:
            self._refused.append(Refusal(op.request_id, RefusalReason.NO_GPU_BLOCKS))
        else:
            seq.table.extend(added)
            self._grants.append(Grant(op.request_id, tuple(added)))

    def _shrink(self, op: Shrink) -> None:  # the blocks past num_tokens go back
        dropped = self._seq(op.request_id).shrink(op, -(-op.num_tokens // self.block_size))
        self.gpu.release(reversed(dropped))

    def _cache_blocks(self, op: CacheBlocks) -> None:  # its next full blocks
        for block_id in self._seq(op.request_id).cache(op, self.registry, self.block_size):
            self.sharing.register(block_id, op.request_id)

    def _drop_cached(self, op: DropCachedBlocks) -> None:
        """Forget the cached blocks nobody holds; held ones keep their entries (their
        requests read them), and so do blocks this batch's hits took."""
        num_gpu, num_cpu = self.gpu.drop_cached(), self.tier.drop()
        self._dropped = CacheDropped(num_gpu_blocks=num_gpu, num_cpu_blocks=num_cpu)

    def _free(self, rid: str) -> None:
        seq = self._seq(rid, swapped=None)
        self._release_gpu(rid, seq.held())
        del self.seqs[rid]
        self.cpu.release(seq.cpu_blocks or ())

    def _release_leading(self, op: ReleaseBlocks) -> None:
        blocks = self._seq(op.request_id).release(op)
        self.sharing.release(op.request_id, blocks, is_partial=True)
        self.gpu.release(reversed(blocks))

    def _swap_out(self, op: SwapOut) -> None:  # refused: freed instead
        seq = self._seq(op.request_id)
        held = seq.held()
        if (cpu_blocks := self.cpu.allocate(len(held))) is None:
            self._free(op.request_id)
            self._refused.append(Refusal(op.request_id, RefusalReason.NO_CPU_BLOCKS))
            return
        self._copies_out.extend(zip(held, cpu_blocks, strict=True))
        self._release_gpu(op.request_id, held)
        seq.swap_out(cpu_blocks)

    def _swap_in(self, op: SwapIn) -> None:
        """Fresh GPU blocks for its CPU ones, covering `num_tokens`; the grant: the table."""
        seq = self._seq(op.request_id, swapped=True)
        cpu_blocks = seq.cpu_blocks or []
        positions = -(-op.num_tokens // self.block_size) - seq.num_released
        if (gpu_blocks := self.gpu.allocate(max(len(cpu_blocks), positions))) is None:
            self._refused.append(Refusal(op.request_id, RefusalReason.NO_GPU_BLOCKS))
            return
        self._copies_in.extend(zip(cpu_blocks, gpu_blocks, strict=False))
        seq.swap_in(gpu_blocks)
        self._grants.append(Grant(op.request_id, tuple(seq.table)))

    def _release_gpu(self, rid: str, blocks: list[int]) -> None:
        """Drop all of rid's GPU blocks (`blocks`: those it holds), tail first (evicted first)."""
        self.sharing.release(rid, blocks)
        self.sharing.forget(rid)
        self.gpu.release(reversed(blocks))
