"""An approximate prefix tree of what one replica has served, for the router.

The router cannot see a replica's KV cache; it remembers the prompts it sent there instead.
A radix tree over text (edges are strings): `match(key)` is how many leading characters of
`key` some remembered prompt shares, `insert(key)` remembers one. It is approximate on purpose:
the replica may have evicted those blocks, and characters are not tokens. Memory is bounded by
`max_chars`: past it, least recently used leaves are cut until the tree is at 90% of it.

Pure and synchronous (no asyncio): the router's policy owns one per replica.
"""

from __future__ import annotations

import heapq
import itertools


class _Node:
    __slots__ = ("children", "edge", "last_used", "parent")

    def __init__(self, edge: str, parent: _Node | None, last_used: int) -> None:
        self.edge = edge  # the label on the edge from the parent to this node
        self.parent = parent
        self.children: dict[str, _Node] = {}  # first character of the child's edge -> child
        self.last_used = last_used


def _common_length(a: str, b: str, start: int) -> int:
    """How many characters of `a` equal `b[start:]`, from the beginning of `a`."""
    n = min(len(a), len(b) - start)
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


class PrefixTree:
    """Remembered prompts of one replica; `num_chars` is the size of all edges together."""

    def __init__(self, max_chars: int) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        self.max_chars = max_chars
        self.num_chars = 0
        self._clock = itertools.count(1)  # a logical clock: LRU order without wall time
        self._root = _Node("", None, 0)

    def match(self, key: str) -> int:
        """Characters of `key`'s longest prefix that the tree holds (no side effects)."""
        node, pos = self._root, 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            common = _common_length(child.edge, key, pos)
            pos += common
            if common < len(child.edge):
                break
            node = child
        return pos

    def insert(self, key: str) -> None:
        """Remember `key`; marks its path as just used; evicts past `max_chars`."""
        now = next(self._clock)
        node, pos = self._root, 0
        node.last_used = now
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = _Node(key[pos:], node, now)
                node.children[key[pos]] = leaf
                self.num_chars += len(leaf.edge)
                break
            common = _common_length(child.edge, key, pos)
            if common < len(child.edge):  # split the edge at the divergence
                middle = _Node(child.edge[:common], node, now)
                node.children[key[pos]] = middle
                child.edge = child.edge[common:]
                child.parent = middle
                middle.children[child.edge[0]] = child
                child = middle
            child.last_used = now
            pos += common
            node = child
        if self.num_chars > self.max_chars:
            self._evict(self.max_chars * 9 // 10)

    def _evict(self, target: int) -> None:
        """Cut least recently used leaves until `num_chars <= target`."""
        leaves = [(n.last_used, id(n), n) for n in self._leaves()]
        heapq.heapify(leaves)
        while self.num_chars > target and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None, "the root is never a leaf to evict"
            del parent.children[leaf.edge[0]]
            self.num_chars -= len(leaf.edge)
            if parent is not self._root and not parent.children:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))

    def _leaves(self) -> list[_Node]:
        out: list[_Node] = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out
