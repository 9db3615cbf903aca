"""The prefix-cache index: which GPU block holds the KV of which chain of full blocks.

A block's key is (serial of its parent's entry, its own token ids). Serials are never reused, so
the key names the whole prefix exactly: the dict compares token tuples on every hit, a hash
collision can never serve another prefix's KV, and children of an evicted parent simply become
unreachable (they age out of the LRU like any other cached block).

    prompt:   [ t0 .. t15 ][ t16 .. t31 ][ t32 .. t40 ]
    keys:     (ROOT, b0)    (s0, b1)      -- partial blocks are never cached
    serials:   s0            s1

Namespaces (SamplingParams.cache_namespace: a LoRA adapter, a cache_salt): KV computed through an
adapter, or under a salt, may serve only requests of the same namespace. Each non-empty one
chains from a root serial of its own, drawn from the same never-reused counter, so its keys can
never equal another's. The roots are bounded (the least recently used is forgotten): the chains
under a forgotten root become unreachable and age out like an evicted parent's children, and a
namespace that comes back gets a fresh root (its old entries are misses, never wrong hits).

    base:       (ROOT, b0) -> s0        adapter a:  (r_a, b0) -> s5     r_a = root(its namespace)
"""

from __future__ import annotations

from collections import OrderedDict

ROOT_SERIAL = 0  # the root of the base namespace ("")
# Non-empty namespaces remembered at once, so a request per unique cache_salt cannot grow memory
# without bound: each costs a dict entry and its name (<= 128 + 256 characters), ~30 MB at worst.
MAX_NAMESPACES = 65_536

CacheKey = tuple[int, tuple[int, ...]]


class PrefixCache:
    """Maps (parent serial, block tokens) to the block that holds that KV, and back."""

    def __init__(self, max_namespaces: int = MAX_NAMESPACES) -> None:
        if max_namespaces < 1:
            raise ValueError(f"max_namespaces must be >= 1, got {max_namespaces}")
        self._index: dict[CacheKey, int] = {}
        # block id -> (its key, serial of its entry); one dict, so a register is one insert
        self._entry_of: dict[int, tuple[CacheKey, int]] = {}
        self._next_serial = ROOT_SERIAL + 1
        self._roots: OrderedDict[str, int] = OrderedDict()  # namespace -> root, oldest use first
        self.max_namespaces = max_namespaces

    def root(self, namespace: str) -> int:
        """The serial a request of `namespace` chains its blocks from: ROOT_SERIAL for the
        base namespace "", else its own (new the first time, or after it was forgotten)."""
        if not namespace:
            return ROOT_SERIAL
        roots = self._roots
        serial = roots.get(namespace)
        if serial is not None:
            roots.move_to_end(namespace)
            return serial
        if len(roots) >= self.max_namespaces:
            roots.popitem(last=False)  # its chains become unreachable: they age out
        serial, self._next_serial = self._next_serial, self._next_serial + 1
        roots[namespace] = serial
        return serial

    @property
    def num_namespaces(self) -> int:
        """Non-empty namespaces whose root is remembered."""
        return len(self._roots)

    def lookup(self, parent_serial: int, token_ids: tuple[int, ...]) -> int | None:
        """The block holding exactly this block of tokens after this parent, if cached."""
        return self._index.get((parent_serial, token_ids))

    def serial(self, block_id: int) -> int:
        return self._entry_of[block_id][1]

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._entry_of

    def register(
        self, block_id: int, parent_serial: int, token_ids: tuple[int, ...], serial: int = 0
    ) -> int:
        """Record that `block_id` holds these tokens; the serial that now names them (`serial`:
        the one an entry moving in from the other tier keeps, so its children's keys stay valid;
        0: a new one). If another block already holds the prefix, that entry wins (first writer
        keeps it) and `block_id` stays unregistered: its request chains on from that serial."""
        key = (parent_serial, token_ids)
        # setdefault: the key (a tuple of a block's tokens) is hashed once, hit or miss.
        existing = self._index.setdefault(key, block_id)
        if (entry := self._entry_of.get(existing)) is not None:
            if existing != block_id or entry[0] == key:  # the prefix is already cached
                return entry[1]
            del self._index[key]  # misuse: undo the insert before raising
            raise ValueError(f"block {block_id} is already registered in the prefix cache")
        if serial == ROOT_SERIAL:
            serial, self._next_serial = self._next_serial, self._next_serial + 1
        self._entry_of[block_id] = (key, serial)
        return serial

    def forget(self, block_id: int) -> tuple[CacheKey, int]:
        """Drop the block's entry (it is being evicted for reuse); its key and serial."""
        entry = self._entry_of.pop(block_id)
        del self._index[entry[0]]
        return entry
