"""Allocator core: owns the GPU and CPU block pools, every request's block table and the
prefix cache; answers each AllocateBatch with one AllocationResult."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from troupe.actors.core.base import Outgoing
from troupe.actors.core.block_pool import BlockPool
from troupe.actors.core.prefix_cache import ROOT_SERIAL, PrefixCache
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    CacheBlocks,
    FreeRequest,
    Grow,
    SwapIn,
    SwapOut,
)
from troupe.messages.scheduler import AllocationResult, Grant


@dataclass(slots=True)
class _Seq:
    table: list[int] = field(default_factory=list)  # GPU blocks, in position order
    cpu_blocks: list[int] | None = None  # set while swapped out
    num_hashed_blocks: int = 0  # leading blocks registered in (or served by) the prefix cache
    serial: int = ROOT_SERIAL  # cache serial of the last hashed block


class AllocatorCore:
    """Inbox: AllocateBatch. Outbox: "scheduler" (AllocationResult).

    Ops apply in order. Running out of blocks is a denial in the result (the request is left
    unchanged); misuse -- an unknown request, a double free, a malformed op -- raises ValueError.
    """

    def __init__(
        self,
        *,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        enable_prefix_caching: bool = True,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.cache = PrefixCache() if enable_prefix_caching else None
        self.gpu = BlockPool(num_gpu_blocks, self.cache)
        self.cpu = BlockPool(num_cpu_blocks)
        self.seqs: dict[str, _Seq] = {}
        self.prefix_cache_hit_tokens = 0
        self.prefix_cache_query_tokens = 0

    def handle(self, batch: Sequence[AllocateBatch]) -> Outgoing:
        return [("scheduler", self.apply(msg)) for msg in batch]

    def apply(self, batch: AllocateBatch) -> AllocationResult:
        """Apply one batch of ops in order."""
        grants: list[Grant] = []
        denied: list[str] = []
        swap_failed: list[str] = []
        swap_out: list[tuple[int, int]] = []
        swap_in: list[tuple[int, int]] = []
        # CPU blocks read by this step's swap-ins must not be rewritten by its swap-outs (the
        # executor copies out before in), so they return to the pool only after the batch.
        cpu_released: list[int] = []
        # Dispatch commonest first (a decode step is mostly Grow and CacheBlocks).
        for op in batch.ops:
            if isinstance(op, Grow):
                added = self.grow(op.request_id, op.num_tokens)
                if added is None:
                    denied.append(op.request_id)
                else:
                    grants.append(Grant(op.request_id, tuple(added)))
            elif isinstance(op, CacheBlocks):
                self.cache_blocks(op.request_id, op.token_ids)
            elif isinstance(op, FreeRequest):
                self.free(op.request_id)
            elif isinstance(op, SwapOut):
                pairs = self.swap_out(op.request_id)
                if pairs is None:
                    swap_failed.append(op.request_id)
                else:
                    swap_out.extend(pairs)
            elif isinstance(op, SwapIn):
                pairs = self.swap_in(op.request_id, op.num_tokens, cpu_released)
                if pairs is None:
                    denied.append(op.request_id)
                else:
                    swap_in.extend(pairs)
                    grants.append(Grant(op.request_id, tuple(self.seqs[op.request_id].table)))
            elif isinstance(op, AllocateNew):
                got = self.allocate_new(op.request_id, op.token_ids, op.num_new_tokens)
                if got is None:
                    denied.append(op.request_id)
                else:
                    grants.append(Grant(op.request_id, tuple(got[0]), got[1]))
            else:
                raise ValueError(f"unknown allocator op {op!r}")
        self.cpu.release(cpu_released)
        return AllocationResult(
            step_id=batch.step_id,
            grants=tuple(grants),
            denied=tuple(denied),
            swap_failed=tuple(swap_failed),
            swap_out=tuple(swap_out),
            swap_in=tuple(swap_in),
            num_gpu_free=self.gpu.num_free,
            num_gpu_cached=self.gpu.num_cached,
            num_cpu_free=self.cpu.num_free,
            prefix_cache_hit_tokens=self.prefix_cache_hit_tokens,
            prefix_cache_query_tokens=self.prefix_cache_query_tokens,
        )

    # -- ops ---------------------------------------------------------------------------------

    def _seq(self, request_id: str) -> _Seq:
        seq = self.seqs.get(request_id)
        if seq is None:
            raise ValueError(f"allocator: unknown request {request_id!r}")
        return seq

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate_new(
        self, request_id: str, token_ids: Sequence[int], num_new_tokens: int
    ) -> tuple[list[int], int] | None:
        """(table, cached tokens) for a new request, or None if the pool is short."""
        if request_id in self.seqs:
            raise ValueError(f"allocator: request {request_id!r} already holds blocks")
        if num_new_tokens < 1 or not token_ids:
            raise ValueError(
                f"allocator: request {request_id!r} asks for {num_new_tokens} new tokens "
                f"of {len(token_ids)}; both must be >= 1"
            )
        bs = self.block_size
        hits: list[int] = []
        serial = ROOT_SERIAL
        if self.cache is not None:
            # Never the block holding the last token: it must be computed to give logits.
            for i in range((len(token_ids) - 1) // bs):
                block_id = self.cache.lookup(serial, tuple(token_ids[i * bs : (i + 1) * bs]))
                if block_id is None:
                    break
                hits.append(block_id)
                serial = self.cache.serial(block_id)
        num_cached = len(hits) * bs
        num_tokens = min(len(token_ids), num_cached + num_new_tokens)
        need = self._blocks_for(num_tokens) - len(hits)
        revived = sum(1 for b in hits if self.gpu.ref[b] == 0)  # cached-free hits use up free
        if need + revived > self.gpu.num_free:
            return None
        for block_id in hits:
            self.gpu.take(block_id)
        fresh = self.gpu.allocate(need)
        assert fresh is not None, "checked above"
        self.seqs[request_id] = _Seq(hits + fresh, None, len(hits), serial)
        self.prefix_cache_query_tokens += len(token_ids)
        self.prefix_cache_hit_tokens += num_cached
        return hits + fresh, num_cached

    def grow(self, request_id: str, num_tokens: int) -> list[int] | None:
        """Blocks added so the table covers `num_tokens`, or None if the pool is short."""
        seq = self._seq(request_id)
        if seq.cpu_blocks is not None:
            raise ValueError(f"allocator: request {request_id!r} is swapped out; swap it in first")
        need = -(-num_tokens // self.block_size) - len(seq.table)
        if need <= 0:
            return []
        added = self.gpu.allocate(need)
        if added is None:
            return None
        seq.table.extend(added)
        return added

    def cache_blocks(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Register the request's next full, computed blocks in the prefix cache."""
        seq = self._seq(request_id)
        bs = self.block_size
        num_blocks = len(token_ids) // bs
        if len(token_ids) % bs or seq.num_hashed_blocks + num_blocks > len(seq.table):
            raise ValueError(
                f"allocator: CacheBlocks for {request_id!r} has {len(token_ids)} tokens; it needs "
                f"a multiple of block_size {bs} within its {len(seq.table)} blocks "
                f"({seq.num_hashed_blocks} already cached)"
            )
        if seq.cpu_blocks is not None:
            raise ValueError(f"allocator: request {request_id!r} is swapped out; cannot cache")
        cache = self.cache
        if cache is None:
            return
        if num_blocks == 1:  # the common case: one block filled since the last step
            seq.serial = cache.register(
                seq.table[seq.num_hashed_blocks], seq.serial, tuple(token_ids)
            )
            seq.num_hashed_blocks += 1
            return
        for i in range(num_blocks):
            block_id = seq.table[seq.num_hashed_blocks]
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            seq.serial = cache.register(block_id, seq.serial, chunk)
            seq.num_hashed_blocks += 1

    def free(self, request_id: str) -> None:
        """Release all of the request's blocks; tail blocks first, so they are evicted first."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            raise ValueError(f"allocator: free of unknown request {request_id!r} (double free?)")
        self.gpu.release(reversed(seq.table))
        if seq.cpu_blocks is not None:
            self.cpu.release(seq.cpu_blocks)

    def swap_out(self, request_id: str) -> list[tuple[int, int]] | None:
        """(gpu, cpu) copies; None if the CPU pool is short (the request is freed instead)."""
        seq = self._seq(request_id)
        if seq.cpu_blocks is not None:
            raise ValueError(f"allocator: request {request_id!r} is already swapped out")
        cpu_blocks = self.cpu.allocate(len(seq.table))
        if cpu_blocks is None:
            self.free(request_id)
            return None
        pairs = list(zip(seq.table, cpu_blocks, strict=True))
        self.gpu.release(reversed(seq.table))
        seq.table = []
        seq.cpu_blocks = cpu_blocks
        return pairs

    def swap_in(
        self, request_id: str, num_tokens: int, cpu_released: list[int]
    ) -> list[tuple[int, int]] | None:
        """(cpu, gpu) copies into fresh GPU blocks, plus growth to `num_tokens`; None if the GPU
        pool is short (nothing changes)."""
        seq = self._seq(request_id)
        if seq.cpu_blocks is None:
            raise ValueError(f"allocator: request {request_id!r} is not swapped out")
        num_copied = len(seq.cpu_blocks)
        gpu_blocks = self.gpu.allocate(max(num_copied, self._blocks_for(num_tokens)))
        if gpu_blocks is None:
            return None
        pairs = list(zip(seq.cpu_blocks, gpu_blocks[:num_copied], strict=True))
        cpu_released.extend(seq.cpu_blocks)
        seq.table = gpu_blocks
        seq.cpu_blocks = None
        return pairs

    def check(self) -> None:
        """Assert pool invariants, and that reference counts match the tables."""
        self.gpu.check()
        self.cpu.check()
        refs = [0] * self.gpu.num_blocks
        cpu_refs = [0] * self.cpu.num_blocks
        for seq in self.seqs.values():
            for b in seq.table:
                refs[b] += 1
            for b in seq.cpu_blocks or ():
                cpu_refs[b] += 1
        assert refs == self.gpu.ref, "GPU reference counts disagree with the block tables"
        assert cpu_refs == self.cpu.ref, "CPU reference counts disagree with the swapped tables"
