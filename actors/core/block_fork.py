"""The allocator's side of parallel sampling (sample_fork.py is the scheduler's): a Fork turns a
parent's block table into one table per sample. Full blocks are shared by reference; the last,
partial block is copied for every sample but the first (copy on write: the step's copy_blocks).

    parent   [b0 b1 b2]       9 tokens computed, block_size 4: b2 partial
    sample 0 [b0 b1 b2 | grown]    the parent's own table
    sample 1 [b0 b1 c1 | grown]    c1: a fresh block, b2 copied into it; b0, b1: 2 references
"""

from __future__ import annotations

from troupe.actors.core.block_pool import BlockPool
from troupe.actors.core.block_sharing import BlockSharing
from troupe.actors.core.block_table import BlockTable
from troupe.messages.allocator import Fork
from troupe.messages.scheduler import Grant


def fork_tables(
    op: Fork,
    parent: BlockTable,
    seqs: dict[str, BlockTable],
    gpu: BlockPool,
    sharing: BlockSharing,
    block_size: int,
) -> tuple[list[Grant], list[tuple[int, int]]]:
    """Replace `parent` in `seqs` by its samples' tables (each grown to op.num_tokens); their
    grants and the (gpu, gpu) copies. A shortage raises: the planner counts the blocks."""
    rid, children = op.request_id, op.child_ids
    if len(children) < 2 or any(c in seqs for c in children):
        raise ValueError(f"allocator: Fork of {rid!r} into {children} (ids in use?)")
    num_full, has_partial = divmod(op.num_computed, block_size)
    has_partial = min(has_partial, 1)
    if len(parent.table) < num_full + has_partial:
        holds = f"it holds {len(parent.table)} blocks"
        raise ValueError(f"allocator: Fork of {rid!r} at {op.num_computed} tokens; {holds}")
    cover = -(-op.num_tokens // block_size)
    grow0, grow = max(0, cover - len(parent.table)), max(0, cover - num_full - has_partial)
    need = grow0 + (len(children) - 1) * (has_partial + grow)
    fresh = gpu.allocate(need)
    if fresh is None:
        free = f"{gpu.num_free} are free: the planner must count them"
        raise ValueError(f"allocator: Fork of {rid!r} needs {need} blocks, {free}")
    del seqs[rid]
    shared = parent.table[parent.num_released : num_full]
    tables = [parent.table + [fresh.pop() for _ in range(grow0)]]
    copies: list[tuple[int, int]] = []
    for _ in children[1:]:
        table = parent.table[:num_full]
        if has_partial:
            table.append(fresh.pop())
            copies.append((parent.table[num_full], table[-1]))
        tables.append(table + [fresh.pop() for _ in range(grow)])
    for child, table in zip(children, tables, strict=True):
        seq = seqs[child] = BlockTable(table, None, parent.num_hashed_blocks, parent.serial)
        seq.num_released, seq.is_cache_stopped = parent.num_released, parent.is_cache_stopped
    for block_id in shared:  # one reference more per child but the first
        gpu.ref[block_id] += len(children) - 1
    sharing.fork(rid, children, shared)
    return [Grant(c, tuple(t)) for c, t in zip(children, tables, strict=True)], copies
