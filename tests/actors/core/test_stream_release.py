"""The allocator's side of StreamingLLM, with exact block ids: ReleaseBlocks keeps the sink
blocks, a swap moves only what is held and puts the sinks back in front, a streaming request
hits the prefix cache only inside its first sinks + window tokens, misuse raises."""

from __future__ import annotations

import pytest
from troupe.actors.core.allocator import AllocatorCore
from troupe.messages.allocator import (
    AllocateBatch,
    AllocateNew,
    CacheBlocks,
    FreeRequest,
    ReleaseBlocks,
    SwapIn,
    SwapOut,
)
from troupe.messages.scheduler import AllocationResult

from tests.actors.core.allocator_invariants import check_allocator

BS = 4


def apply(alloc: AllocatorCore, *ops: object) -> AllocationResult:
    result = alloc.apply(AllocateBatch(step_id=1, ops=tuple(ops)))  # type: ignore[arg-type]
    check_allocator(alloc)
    return result


def test_release_keeps_sinks_and_swap_puts_them_back() -> None:
    alloc = AllocatorCore(block_size=BS, num_gpu_blocks=8, num_cpu_blocks=8)
    apply(alloc, AllocateNew("r", tuple(range(20)), 20))  # blocks 0..4
    assert alloc.seqs["r"].table == [0, 1, 2, 3, 4]
    apply(alloc, ReleaseBlocks("r", 3, num_kept=1))  # positions 1, 2 go
    seq = alloc.seqs["r"]
    assert seq.held() == [0, 3, 4] and alloc.gpu.num_free == 5
    apply(alloc, ReleaseBlocks("r", 4, num_kept=1))  # and 3
    assert seq.held() == [0, 4] and seq.num_released == 3
    with pytest.raises(ValueError, match="keeps 0 blocks"):
        apply(alloc, ReleaseBlocks("r", 5, num_kept=0))
    out = apply(alloc, SwapOut("r"))
    assert [gpu for gpu, _ in out.swap_out] == [0, 4]  # only the held blocks move
    assert alloc.gpu.num_free == 8
    back = apply(alloc, SwapIn("r", 24))
    table = back.grants[0].block_ids
    # a fresh block for the sink in front, the stale positions, then the window and growth
    assert len(table) == 6 and table[1:4] == (1, 2, 3)
    assert [gpu for _, gpu in back.swap_in] == [table[0], table[4]]
    assert alloc.seqs["r"].held() == [table[0], table[4], table[5]]
    apply(alloc, FreeRequest("r"))
    assert alloc.gpu.num_free == 8 and alloc.cpu.num_free == 8


def test_streaming_hits_only_inside_sinks_and_window() -> None:
    alloc = AllocatorCore(block_size=BS, num_gpu_blocks=16, num_cpu_blocks=0)
    tokens = tuple(range(24))
    apply(alloc, AllocateNew("a", tokens, 24), CacheBlocks("a", tokens[:20]))
    apply(alloc, FreeRequest("a"))
    full = apply(alloc, AllocateNew("b", tokens, 4))
    assert full.grants[0].num_cached_tokens == 20  # everything but the last block's
    limited = apply(alloc, AllocateNew("c", tokens, 4, cache_limit=10))
    assert limited.grants[0].num_cached_tokens == 8  # blocks wholly inside the first 10
