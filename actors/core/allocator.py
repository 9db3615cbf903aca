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
from troupe.actors.core.prefix_cache import PrefixCache
from troupe.actors.core.prefix_tier import CpuPrefixTier
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    CacheBlocks,
    Fork,
    FreeRequest,
    Grow,
    ReleaseBlocks,
    Shrink,
    SwapIn,
    SwapOut,
)
from troupe.messages.scheduler import AllocationResult, Grant, Refusal, RefusalReason

NO_GPU, NO_CPU = RefusalReason.NO_GPU_BLOCKS, RefusalReason.NO_CPU_BLOCKS


class AllocatorCore:
    """Inbox: AllocateBatch. Outbox: "scheduler" (AllocationResult).

    Ops apply in the order sent (queue order), so a shortage lands on the last: a Refusal (the
    request unchanged; a refused SwapOut frees it). Misuse raises ValueError."""

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
        self.caching = enable_prefix_caching  # off: nothing is registered, so nothing hits
        self.cache = PrefixCache()
        self.cpu = BlockPool(num_cpu_blocks, PrefixCache())
        self.tier = CpuPrefixTier(self.cpu, enabled=cpu_prefix_tier and self.caching)
        self.gpu = BlockPool(num_gpu_blocks, self.cache, self.tier.evicted, warm_first=warm_first)
        self.seqs: dict[str, BlockTable] = {}
        self.sharing = BlockSharing()  # who holds the blocks that can be shared
        # this batch's (gpu, cpu), (cpu, gpu) and (gpu, gpu: a Fork's) copies
        self._copies_out: list[tuple[int, int]] = []
        self._copies_in: list[tuple[int, int]] = []
        self._copies: list[tuple[int, int]] = []
        self.prefix_cache_hit_tokens = self.prefix_cache_query_tokens = 0
        self._ops: dict[type, Callable[[Any], Grant | Refusal | list[Grant] | None]] = {
            Grow: self._grow,
            CacheBlocks: self._cache_blocks,
            FreeRequest: lambda op: self._free(op.request_id),
            Shrink: self._shrink,
            ReleaseBlocks: self._release_leading,
            SwapOut: self._swap_out,
            SwapIn: self._swap_in,
            AllocateNew: self._allocate_new,
            Fork: self._fork,
        }

    def handle(self, batch: Sequence[AllocateBatch]) -> Outgoing:
        return [("scheduler", self.apply(msg)) for msg in batch]

    def apply(self, batch: AllocateBatch) -> AllocationResult:
        self._copies_out, self._copies_in, self._copies = [], [], []
        grants: list[Grant] = []
        refused: list[Refusal] = []
        ops = self._ops
        for op in batch.ops:
            if (handler := ops.get(type(op))) is None:
                raise ValueError(f"unknown allocator op {op!r}")
            answer = handler(op)
            if answer is None:
                continue
            if isinstance(answer, Grant):
                grants.append(answer)
            elif isinstance(answer, Refusal):
                refused.append(answer)
            else:  # a Fork's grants
                grants.extend(answer)
        # CPU blocks read by this step's swap-ins must not be rewritten by its swap-outs (the
        # executor copies out before in), so they return to the pool only after the batch.
        self.cpu.release(cpu for cpu, _ in self._copies_in)
        tier_out, tier_in = self.tier.end_batch()
        return AllocationResult(
            step_id=batch.step_id,
            grants=tuple(grants),
            refused=tuple(refused),
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
        )

    def _seq(self, request_id: str, swapped: bool | None = False) -> BlockTable:
        """The request's blocks; `swapped`: whether it must be swapped out (None: either)."""
        seq = self.seqs.get(request_id)
        if seq is None:
            raise ValueError(f"allocator: unknown request {request_id!r} (double free?)")
        if swapped is not None and (seq.cpu_blocks is not None) is not swapped:
            state = "is swapped out" if seq.cpu_blocks is not None else "is not swapped out"
            raise ValueError(f"allocator: request {request_id!r} {state}")
        return seq

    def _allocate_new(self, op: AllocateNew) -> Grant | Refusal:
        """Its longest cached prefix (prefix_tier.walk), then blocks for num_new_tokens more."""
        rid, token_ids, bs, cache = op.request_id, op.token_ids, self.block_size, self.cache
        if rid in self.seqs:
            raise ValueError(f"allocator: request {rid!r} already holds blocks")
        if op.num_new_tokens < 1 or not token_ids:
            raise ValueError(f"allocator: AllocateNew of {rid!r} needs tokens, got {op}")
        tier = self.tier
        looked_up = token_ids[: op.cache_limit] if op.cache_limit else token_ids
        hits, serial = tier.walk(cache, looked_up, bs)  # (block, whether in the CPU tier)
        num_cached = len(hits) * bs
        need = -(-min(len(token_ids), num_cached + op.num_new_tokens) // bs) - len(hits)
        # cached-free GPU hits use up free blocks, and each CPU hit needs a GPU block
        num_cpu = sum(1 for _, on_cpu in hits if on_cpu)
        revived = sum(1 for b, on_cpu in hits if not on_cpu and self.gpu.ref[b] == 0)
        if need + revived + num_cpu > self.gpu.num_free:
            return Refusal(rid, NO_GPU)
        seq = self.seqs[rid] = BlockTable([], None, len(hits), serial)
        moved = [(b, tier.take(b)) for b, on_cpu in hits if on_cpu]  # first: allocating evicts
        for block_id, on_cpu in hits:
            if not on_cpu:
                self.sharing.hold(block_id, rid)
                self.gpu.take(block_id)
        fresh = self.gpu.allocate(need + num_cpu)
        assert fresh is not None, "checked above"
        gpu_of: dict[int, int] = {}
        for cpu_block, entry in moved:  # back in the GPU tier under the same key
            gpu_block = gpu_of[cpu_block] = tier.bring_back(cpu_block, entry, fresh.pop(), cache)
            self.sharing.register(gpu_block, rid)
        seq.table = [gpu_of[b] if on_cpu else b for b, on_cpu in hits] + fresh
        self.prefix_cache_query_tokens += len(token_ids)
        self.prefix_cache_hit_tokens += num_cached
        tier.hit_tokens += num_cpu * bs
        return Grant(rid, tuple(seq.table), num_cached)

    def _fork(self, op: Fork) -> list[Grant]:  # block_fork.py
        parent, bs = self._seq(op.request_id), self.block_size
        grants, copies = fork_tables(op, parent, self.seqs, self.gpu, self.sharing, bs)
        self._copies += copies
        return grants

    def _grow(self, op: Grow) -> Grant | Refusal:  # grant: the added blocks
        seq = self._seq(op.request_id)
        need = -(-op.num_tokens // self.block_size) - len(seq.table)
        added = self.gpu.allocate(need) if need > 0 else []
        if added is None:
            return Refusal(op.request_id, NO_GPU)
        seq.table.extend(added)
        return Grant(op.request_id, tuple(added))

    def _shrink(self, op: Shrink) -> None:  # the blocks past num_tokens go back
        dropped = self._seq(op.request_id).shrink(op, -(-op.num_tokens // self.block_size))
        self.gpu.release(reversed(dropped))

    def _cache_blocks(self, op: CacheBlocks) -> None:  # its next full blocks
        cache = self.cache if self.caching else None
        for block_id in self._seq(op.request_id).cache(op, cache, self.block_size):
            self.sharing.register(block_id, op.request_id)

    def _free(self, rid: str) -> None:
        seq = self._seq(rid, swapped=None)
        self._release_gpu(rid, seq)
        del self.seqs[rid]
        self.cpu.release(seq.cpu_blocks or ())

    def _release_leading(self, op: ReleaseBlocks) -> None:
        blocks = self._seq(op.request_id).release(op)
        self.sharing.release(op.request_id, blocks, is_partial=True)
        self.gpu.release(reversed(blocks))

    def _swap_out(self, op: SwapOut) -> Refusal | None:  # refused: freed instead
        seq = self._seq(op.request_id)
        held = seq.held()
        cpu_blocks = self.cpu.allocate(len(held))
        if cpu_blocks is None:
            self._free(op.request_id)
            return Refusal(op.request_id, NO_CPU)
        self._copies_out.extend(zip(held, cpu_blocks, strict=True))
        self._release_gpu(op.request_id, seq)
        seq.swap_out(cpu_blocks)
        return None

    def _swap_in(self, op: SwapIn) -> Grant | Refusal:
        """Fresh GPU blocks for its CPU ones, covering `num_tokens`; the grant: the table."""
        seq = self._seq(op.request_id, swapped=True)
        cpu_blocks = seq.cpu_blocks or []
        positions = -(-op.num_tokens // self.block_size) - seq.num_released
        gpu_blocks = self.gpu.allocate(max(len(cpu_blocks), positions))
        if gpu_blocks is None:
            return Refusal(op.request_id, NO_GPU)
        self._copies_in.extend(zip(cpu_blocks, gpu_blocks, strict=False))
        seq.swap_in(gpu_blocks)
        return Grant(op.request_id, tuple(seq.table))

    def _release_gpu(self, rid: str, seq: BlockTable) -> None:
        """Drop all of rid's GPU blocks, tail first (evicted first)."""
        blocks = seq.held()
        self.sharing.release(rid, blocks)
        self.sharing.forget(rid)
        self.gpu.release(reversed(blocks))
