"""Inbox of the Allocator: one AllocateBatch per scheduling step, an ordered list of ops.

The allocator applies the ops in order and answers one `AllocationResult` (messages/scheduler.py).
The scheduler sends them in OP_ORDER (below), so blocks freed (and cached) by one op are
available to the ops after it, and a shortage lands on the least urgent work, which the
allocator refuses (`Refusal`, with a reason).
"""

from __future__ import annotations

import msgspec

# array_like + gc=False on ops: a batch carries a few per step on the hot path; no cycles.


class CacheBlocks(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Register the request's next full blocks (now computed) in the prefix cache.

    `token_ids` fill whole blocks, starting at the first block not yet registered for it.
    """

    request_id: str
    token_ids: tuple[int, ...]


class ReleaseBlocks(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Release the request's blocks at table positions num_kept .. num_blocks - 1: every
    layer's sliding window (or a streaming request's window) has passed them; the first
    `num_kept` hold a streaming request's sink tokens and stay (the same for all its
    releases). Their positions stay in its table (the attention kernels never read them); the
    request keeps its other blocks."""

    request_id: str
    num_blocks: int
    num_kept: int = 0


class FreeRequest(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Drop the request's blocks (GPU and CPU). Registered blocks stay cached until evicted."""

    request_id: str


class Shrink(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Release the request's trailing blocks past those covering `num_tokens` (slots held for
    speculative proposals that are no longer needed). They hold no committed token, so no
    prefix-cache entry and no other holder; no answer."""

    request_id: str
    num_tokens: int


class SwapOut(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Copy the request's GPU blocks to the CPU pool and release the GPU ones.

    Without CPU room the allocator frees the request instead and refuses the op with
    NO_CPU_BLOCKS (the scheduler then recomputes it).
    """

    request_id: str


class SwapIn(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Copy a swapped request back to fresh GPU blocks, then make its table cover `num_tokens`
    (0: no growth). All or nothing; the grant is the whole new table."""

    request_id: str
    num_tokens: int = 0


class Grow(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Make a request's table cover `num_tokens` tokens in all; the grant lists added blocks."""

    request_id: str
    num_tokens: int


class AllocateNew(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Start a request: reuse its longest cached prefix of `token_ids` (block aligned, never the
    last token, so there are logits to sample), then cover `num_new_tokens` more tokens (capped
    at len(token_ids)). The grant is the whole table and the number of cached tokens.

    `namespace` (SamplingParams.cache_namespace): the prefix cache serves it only KV computed
    under the same namespace, and files what it computes under it ("": the base model's)."""

    request_id: str
    token_ids: tuple[int, ...]
    num_new_tokens: int
    cache_limit: int = 0  # the hit covers at most the first this many tokens (0: no limit)
    namespace: str = ""  # last: traces recorded before it decode with the base namespace


class Fork(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Parallel sampling: the request's table becomes `child_ids[0]`'s and is shared by every
    child (one more reference per child on each block holding its first `num_computed`
    tokens); its last, partial block is copied for the others (copy on write: the answer's
    `copy_blocks`). Each child's table then grows to cover `num_tokens`. The request's id is
    gone afterwards. The grants: each child's whole table. The scheduler plans the blocks it
    needs, so it is never refused (a shortage raises)."""

    request_id: str
    child_ids: tuple[str, ...]
    num_computed: int
    num_tokens: int


class DropCachedBlocks(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=True):
    """Forget every cached block no request holds, in the GPU pool and the prefix cache's CPU
    tier (Engine.reset_prefix_cache; after a weight update). Blocks requests hold keep their
    entries. Last in its batch, so the batch's frees are dropped too; answered in
    AllocationResult.cache_dropped."""


AllocOp = (
    CacheBlocks
    | ReleaseBlocks
    | FreeRequest
    | Shrink
    | SwapOut
    | SwapIn
    | Grow
    | AllocateNew
    | Fork
)


# The order ops apply in: releases first (their blocks serve the rest), then by queue.
# CacheBlocks before ReleaseBlocks: a block is registered before a window lets it go. A Shrink
# goes before FreeRequest: a request shrunk, then chosen as a victim, is freed after. A Fork
# after every release (the blocks it takes were counted free) and before its samples' ops.
# A DropCachedBlocks (not a request's op) follows them all: what the batch freed is dropped
# too, and its hits are held already.
OP_ORDER = (
    CacheBlocks, ReleaseBlocks, Shrink, FreeRequest, SwapOut, Fork, Grow, SwapIn, AllocateNew
)  # fmt: skip


class AllocateBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """One step's worth of allocator work, applied in order."""

    step_id: int
    ops: tuple[AllocOp | DropCachedBlocks, ...] = ()


AllocatorInbox = AllocateBatch
