"""One request's block table as the allocator keeps it: GPU blocks by position, CPU blocks while
swapped out, how far the prefix cache has hashed it, and the positions released behind a window.

    streaming request, num_kept 1, num_released 2:
    table   [b3 | b8 b9 | b4 b6]    held(): [b3, b4, b6]; b8, b9 are stale ids (never read)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from troupe.actors.core.prefix_cache import ROOT_SERIAL, PrefixCache
from troupe.messages.allocator import CacheBlocks, ReleaseBlocks, Shrink


@dataclass(slots=True)
class BlockTable:
    """One request's blocks, as the allocator keeps them."""

    table: list[int] = field(default_factory=list)  # GPU blocks, in position order
    cpu_blocks: list[int] | None = None  # set while swapped out
    num_hashed_blocks: int = 0  # leading blocks registered in (or served by) the prefix cache
    serial: int = ROOT_SERIAL  # cache serial of the last hashed block
    # Table positions num_kept .. num_kept + num_released - 1 were released behind a window
    # (num_kept: a streaming request's sink blocks): their ids are stale (never read), the
    # request no longer holds them. Caching stops if one was never registered.
    num_released: int = 0
    is_cache_stopped: bool = False
    num_kept: int = 0

    @property
    def released_end(self) -> int:
        """The position after the released ones (0: none released)."""
        return self.num_kept + self.num_released if self.num_released else 0

    def held(self) -> list[int]:
        """The GPU blocks it holds, in position order (none while swapped out)."""
        if self.cpu_blocks is not None:
            return []
        if not self.num_released:
            return self.table
        return self.table[: self.num_kept] + self.table[self.num_kept + self.num_released :]

    def release(self, op: ReleaseBlocks) -> list[int]:
        """Let go of the positions after the first op.num_kept, up to op.num_blocks (a window
        moved past them); the blocks newly let go of."""
        if self.num_released and op.num_kept != self.num_kept:
            raise ValueError(
                f"allocator: ReleaseBlocks of {op.request_id!r} keeps {op.num_kept} blocks, "
                f"its earlier releases kept {self.num_kept}"
            )
        self.num_kept = op.num_kept
        start, end = self.num_kept + self.num_released, min(op.num_blocks, len(self.table))
        if end <= start:
            return []
        self.num_released = end - self.num_kept
        return self.table[start:end]

    def cache(self, op: CacheBlocks, cache: PrefixCache | None, block_size: int) -> list[int]:
        """Hash its next full blocks (op.token_ids) into `cache` (None: caching is off: only
        counted); the blocks registered. Released unregistered blocks end the chain for good."""
        token_ids, bs, table = op.token_ids, block_size, self.table
        if len(token_ids) % bs or self.num_hashed_blocks + len(token_ids) // bs > len(table):
            raise ValueError(
                f"allocator: CacheBlocks for {op.request_id!r} has {len(token_ids)} tokens; it "
                f"needs a multiple of block_size {bs} within its {len(table)} blocks"
            )
        if self.num_released and self.num_hashed_blocks < self.num_kept + self.num_released:
            self.is_cache_stopped = True
        if cache is None or self.is_cache_stopped:
            self.num_hashed_blocks += len(token_ids) // bs
            return []
        num_blocks, start = len(token_ids) // bs, self.num_hashed_blocks
        for i in range(num_blocks):  # one block: its tokens as they are
            chunk = token_ids if num_blocks == 1 else token_ids[i * bs : (i + 1) * bs]
            self.serial = cache.register(table[start + i], self.serial, chunk)
        self.num_hashed_blocks += num_blocks
        return table[start : start + num_blocks]

    def shrink(self, op: Shrink, keep: int) -> list[int]:
        """Drop the positions past the first `keep` (held only for proposals); the blocks."""
        if keep < self.num_hashed_blocks or keep > len(self.table):
            raise ValueError(
                f"allocator: Shrink of {op.request_id!r} to {keep} blocks; it holds "
                f"{len(self.table)}, {self.num_hashed_blocks} of them cached"
            )
        dropped = self.table[keep:]
        del self.table[keep:]
        return dropped

    def swap_out(self, cpu_blocks: list[int]) -> None:
        """Its held blocks' KV went to `cpu_blocks`; the released positions stay (stale ids),
        for swap_in to allocate around them."""
        self.table, self.cpu_blocks = self.table[: self.released_end], cpu_blocks

    def swap_in(self, gpu_blocks: list[int]) -> None:
        """Back on `gpu_blocks` (its CPU blocks' KV, then fresh ones), around the released
        positions: the sink blocks take the first."""
        kept = self.num_kept if self.num_released else 0
        self.table = gpu_blocks[:kept] + self.table[kept:] + gpu_blocks[kept:]
        self.cpu_blocks = None
