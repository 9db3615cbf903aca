"""Allocator core: the only owner of block ids, reference counts, the prefix-cache index and the
LRU of cached free blocks. Answers each AllocateBatch with one AllocationResult, whose counts
(free blocks; per request, how many of its blocks others hold too) the scheduler plans with."""

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
from troupe.messages.scheduler import AllocationResult, Grant, Refusal, RefusalReason


@dataclass(slots=True)
class _Seq:
    table: list[int] = field(default_factory=list)  # GPU blocks, in position order
    cpu_blocks: list[int] | None = None  # set while swapped out
    num_hashed_blocks: int = 0  # leading blocks registered in (or served by) the prefix cache
    serial: int = ROOT_SERIAL  # cache serial of the last hashed block
    num_shared: int = 0  # blocks of `table` that other requests hold too


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
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.caching = enable_prefix_caching  # off: nothing is registered, so nothing hits
        self.cache = PrefixCache()
        self.gpu = BlockPool(num_gpu_blocks, self.cache)
        self.cpu = BlockPool(num_cpu_blocks)
        self.seqs: dict[str, _Seq] = {}
        # Who holds a registered block: its one holder (set when registered or revived; a stale
        # entry is never read: only registered blocks are hit), or all while it is shared.
        self._owner: dict[int, str] = {}
        self._sharers: dict[int, dict[str, None]] = {}
        self._shared_changed: dict[str, None] = {}  # requests whose num_shared changed
        self.prefix_cache_hit_tokens = 0
        self.prefix_cache_query_tokens = 0

    def handle(self, batch: Sequence[AllocateBatch]) -> Outgoing:
        return [("scheduler", self.apply(msg)) for msg in batch]

    def apply(self, batch: AllocateBatch) -> AllocationResult:
        grants: list[Grant] = []
        refused: list[Refusal] = []
        swap_out: list[tuple[int, int]] = []
        swap_in: list[tuple[int, int]] = []
        # CPU blocks read by this step's swap-ins must not be rewritten by its swap-outs (the
        # executor copies out before in), so they return to the pool only after the batch.
        cpu_read: list[int] = []
        for op in batch.ops:  # commonest first: a decode step is mostly Grow and CacheBlocks
            rid = op.request_id
            if isinstance(op, Grow):
                grant = self._grow(rid, op.num_tokens)
            elif isinstance(op, CacheBlocks):
                self._cache_blocks(rid, op.token_ids)
                continue
            elif isinstance(op, FreeRequest):
                self._free(rid)
                continue
            elif isinstance(op, SwapOut):
                if not self._swap_out(rid, swap_out):
                    refused.append(Refusal(rid, RefusalReason.NO_CPU_BLOCKS))
                continue
            elif isinstance(op, SwapIn):
                grant = self._swap_in(rid, op.num_tokens, swap_in, cpu_read)
            elif isinstance(op, AllocateNew):
                grant = self._allocate_new(rid, op.token_ids, op.num_new_tokens)
            else:
                raise ValueError(f"unknown allocator op {op!r}")
            if grant is None:
                refused.append(Refusal(rid, RefusalReason.NO_GPU_BLOCKS))
            else:
                grants.append(grant)
        self.cpu.release(cpu_read)
        seqs, changed, self._shared_changed = self.seqs, self._shared_changed, {}
        return AllocationResult(
            step_id=batch.step_id,
            grants=tuple(grants),
            refused=tuple(refused),
            shared=tuple((r, seqs[r].num_shared) for r in changed if r in seqs) if changed else (),
            swap_out=tuple(swap_out),
            swap_in=tuple(swap_in),
            num_gpu_free=self.gpu.num_free,
            num_gpu_cached=self.gpu.num_cached,
            num_cpu_free=self.cpu.num_free,
            prefix_cache_hit_tokens=self.prefix_cache_hit_tokens,
            prefix_cache_query_tokens=self.prefix_cache_query_tokens,
        )

    # -- ops: a Grant, or None when the pool is short (then nothing changes) -----------------

    def _seq(self, request_id: str, swapped: bool = False) -> _Seq:
        seq = self.seqs.get(request_id)
        if seq is None:
            raise ValueError(f"allocator: unknown request {request_id!r} (double free?)")
        if (seq.cpu_blocks is not None) is not swapped:
            state = "is swapped out" if seq.cpu_blocks is not None else "is not swapped out"
            raise ValueError(f"allocator: request {request_id!r} {state}")
        return seq

    def _allocate_new(self, rid: str, token_ids: Sequence[int], num_new: int) -> Grant | None:
        """Its longest cached prefix (whole blocks, never the last token: it must be computed to
        give logits), then blocks for `num_new` more tokens."""
        if rid in self.seqs:
            raise ValueError(f"allocator: request {rid!r} already holds blocks")
        if num_new < 1 or not token_ids:
            raise ValueError(f"allocator: AllocateNew of {rid!r} needs tokens, got {num_new}")
        bs, cache = self.block_size, self.cache
        hits: list[int] = []
        serial = ROOT_SERIAL
        for i in range((len(token_ids) - 1) // bs):
            block_id = cache.lookup(serial, tuple(token_ids[i * bs : (i + 1) * bs]))
            if block_id is None:
                break
            hits.append(block_id)
            serial = cache.serial(block_id)
        num_cached = len(hits) * bs
        need = -(-min(len(token_ids), num_cached + num_new) // bs) - len(hits)
        revived = sum(1 for b in hits if self.gpu.ref[b] == 0)  # cached-free hits use up free
        if need + revived > self.gpu.num_free:
            return None
        self.seqs[rid] = _Seq([], None, len(hits), serial)
        for block_id in hits:
            self._hold(block_id, rid)
            self.gpu.take(block_id)
        fresh = self.gpu.allocate(need)
        assert fresh is not None, "checked above"
        self.seqs[rid].table = hits + fresh
        self.prefix_cache_query_tokens += len(token_ids)
        self.prefix_cache_hit_tokens += num_cached
        return Grant(rid, (*hits, *fresh), num_cached)

    def _grow(self, rid: str, num_tokens: int) -> Grant | None:  # grant: the added blocks
        seq = self._seq(rid)
        need = -(-num_tokens // self.block_size) - len(seq.table)
        added = self.gpu.allocate(need) if need > 0 else []
        if added is None:
            return None
        seq.table.extend(added)
        return Grant(rid, tuple(added))

    def _cache_blocks(self, rid: str, token_ids: Sequence[int]) -> None:  # its next full blocks
        seq, bs = self._seq(rid), self.block_size
        if len(token_ids) % bs or seq.num_hashed_blocks + len(token_ids) // bs > len(seq.table):
            raise ValueError(
                f"allocator: CacheBlocks for {rid!r} has {len(token_ids)} tokens; it needs a "
                f"multiple of block_size {bs} within its {len(seq.table)} blocks"
            )
        num_blocks = len(token_ids) // bs if self.caching else 0
        for i in range(num_blocks):
            block_id = seq.table[seq.num_hashed_blocks]
            # tuple() of the tuple a message carries is that tuple: no copy for one block
            chunk = tuple(token_ids if num_blocks == 1 else token_ids[i * bs : (i + 1) * bs])
            seq.serial = self.cache.register(block_id, seq.serial, chunk)
            seq.num_hashed_blocks += 1
            self._owner[block_id] = rid

    def _free(self, rid: str) -> None:
        seq = self.seqs.get(rid)
        if seq is None:
            raise ValueError(f"allocator: free of unknown request {rid!r} (double free?)")
        self._release_gpu(rid, seq)
        del self.seqs[rid]
        self.cpu.release(seq.cpu_blocks or ())

    def _swap_out(self, rid: str, pairs: list[tuple[int, int]]) -> bool:  # False: freed instead
        seq = self._seq(rid)
        cpu_blocks = self.cpu.allocate(len(seq.table))
        if cpu_blocks is None:
            self._free(rid)
            return False
        pairs.extend(zip(seq.table, cpu_blocks, strict=True))
        self._release_gpu(rid, seq)
        seq.cpu_blocks = cpu_blocks
        return True

    def _swap_in(
        self, rid: str, num_tokens: int, pairs: list[tuple[int, int]], cpu_read: list[int]
    ) -> Grant | None:
        """Fresh GPU blocks for its CPU ones, covering `num_tokens`; the grant: the table."""
        seq = self._seq(rid, True)
        cpu_blocks = seq.cpu_blocks or []
        gpu_blocks = self.gpu.allocate(max(len(cpu_blocks), -(-num_tokens // self.block_size)))
        if gpu_blocks is None:
            return None
        pairs.extend(zip(cpu_blocks, gpu_blocks, strict=False))
        cpu_read.extend(cpu_blocks)
        seq.table, seq.cpu_blocks = gpu_blocks, None
        return Grant(rid, tuple(gpu_blocks))

    # -- who shares which block: what releasing a request frees ------------------------------

    def _hold(self, block_id: int, rid: str) -> None:  # before `rid` takes a hit on it
        num_holders = self.gpu.ref[block_id]
        if num_holders == 0:  # revived from the cached free blocks
            self._owner[block_id] = rid
            return
        if num_holders == 1:  # its one holder shares it from now on
            owner = self._owner[block_id]
            self._sharers[block_id] = {owner: None}
            self._count_shared(owner, 1)
        self._sharers[block_id][rid] = None
        self._count_shared(rid, 1)

    def _release_gpu(self, rid: str, seq: _Seq) -> None:  # tail first: evicted first
        sharers_of = self._sharers
        for block_id in seq.table if sharers_of else ():
            sharers = sharers_of.get(block_id)
            if sharers is not None:
                del sharers[rid]
                if len(sharers) == 1:  # the one left holds it alone now
                    (owner,) = sharers
                    self._owner[block_id] = owner
                    del sharers_of[block_id]
                    self._count_shared(owner, -1)
        self.gpu.release(reversed(seq.table))
        seq.table, seq.num_shared = [], 0

    def _count_shared(self, rid: str, delta: int) -> None:
        self.seqs[rid].num_shared += delta
        self._shared_changed[rid] = None

    def check(self) -> None:
        """Assert pool invariants, and that reference counts and sharing match the tables."""
        self.gpu.check()
        self.cpu.check()
        refs, cpu_refs = [0] * self.gpu.num_blocks, [0] * self.cpu.num_blocks
        for seq in self.seqs.values():
            for b in seq.table:
                refs[b] += 1
            for b in seq.cpu_blocks or ():
                cpu_refs[b] += 1
        assert refs == self.gpu.ref, "GPU reference counts disagree with the block tables"
        assert cpu_refs == self.cpu.ref, "CPU reference counts disagree with the swapped tables"
        for rid, seq in self.seqs.items():
            num_shared = sum(1 for b in seq.table if refs[b] > 1)
            assert seq.num_shared == num_shared, f"{rid} shares {num_shared}, not {seq.num_shared}"
