"""Who holds each block that can be shared, and so, per request, how many of its blocks others
hold too (its `num_shared`): what releasing it would not free. The allocator owns one.

Only blocks that were registered in the prefix cache, hit, or forked can have several holders,
so only they are tracked; a request's count changes when one of them gains or loses a holder:

    a holds b7 alone          a: 0
    b hits b7                 a: 1, b: 1     (both reported in the next AllocationResult)
    a is freed                b: 0
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence


class BlockSharing:
    def __init__(self) -> None:
        self.holders: dict[int, list[str]] = {}  # block id -> requests holding it
        self.num_shared: dict[str, int] = {}  # request id -> its blocks others hold too
        self._changed: dict[str, None] = {}  # requests whose count changed since last taken

    def count(self, rid: str) -> int:
        return self.num_shared.get(rid, 0)

    def register(self, block_id: int, rid: str) -> None:
        """A block `rid` just filled and registered: it holds it alone."""
        self.holders[block_id] = [rid]

    def hold(self, block_id: int, rid: str) -> None:
        """`rid` takes a prefix-cache hit on the block (none held it: revived from the cache)."""
        holders = self.holders.setdefault(block_id, [])
        holders.append(rid)
        if len(holders) == 2:  # its one holder shares it from now on
            self._add(holders[0], 1)
        if len(holders) > 1:
            self._add(rid, 1)

    def fork(self, rid: str, children: Sequence[str], blocks: Iterable[int]) -> None:
        """`rid`'s holds on `blocks` pass to `children`, each of which then shares all of them."""
        num = 0
        for block_id in blocks:
            holders = self.holders.setdefault(block_id, [])
            if rid in holders:
                holders.remove(rid)
            holders.extend(children)
            num += 1
        self.forget(rid)
        for child in children:
            self.num_shared[child] = num
            self._changed[child] = None

    def release(self, rid: str, blocks: Iterable[int], *, is_partial: bool = False) -> None:
        """Drop rid's holds on `blocks`. A partial release (behind a window) keeps rid's count
        true; after a whole one the caller forgets rid."""
        holders_of = self.holders
        for block_id in blocks:
            holders = holders_of.get(block_id)
            if holders is None:
                continue
            if is_partial and len(holders) > 1:  # rid shared it: one fewer
                self._add(rid, -1)
            holders.remove(rid)
            if len(holders) == 1:  # the one left holds it alone now
                self._add(holders[0], -1)
            elif not holders:
                del holders_of[block_id]

    def forget(self, rid: str) -> None:
        """rid holds nothing any more (freed, swapped out or forked)."""
        self.num_shared.pop(rid, None)

    def take_changes(self, live: Container[str]) -> tuple[tuple[str, int], ...]:
        """(request, count) for the live requests whose count changed since the last call."""
        changed, self._changed = self._changed, {}
        return tuple((r, self.num_shared.get(r, 0)) for r in changed if r in live)

    def _add(self, rid: str, delta: int) -> None:
        self.num_shared[rid] = self.num_shared.get(rid, 0) + delta
        self._changed[rid] = None
