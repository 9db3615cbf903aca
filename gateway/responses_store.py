"""Stored responses (OpenAI's `store`): a bounded in-memory map from response id to the
response object and the items that made it, owned by one gateway app (its Gateway).

    put(entry) ─► appended as the newest; then the oldest are evicted until both bounds hold:
                  at most `max_entries` entries and `max_bytes` bytes (an entry larger than
                  `max_bytes` on its own is not kept)
    get(id)    ─► the entry, or None (never stored, evicted, deleted); reading does not make
                  an entry younger: eviction is by age, as OpenAI's retention is
    delete(id) ─► whether it was there

An entry holds JSON bytes, not objects: nothing handed out can change what is stored, and its
size is exact. `items` are the response's whole context: the items of the response it
continued (previous_response_id: that one's context and output) then its own input, so a
conversation continues from any stored turn whatever older turns were evicted.

Response ids name the gateway that stores them: `resp_<home><random>`, `home` being the
gateway's HOME_CHARS hex characters (state.Gateway.home_id, shown on /health), so the router
sends a stored response's reads, and the turns that continue it, to the replica holding it.
"""

from __future__ import annotations

import collections
import dataclasses
import uuid
from typing import Any

import msgspec

HOME_CHARS = 12
_PREFIX = "resp_"
_decode = msgspec.json.Decoder()


def new_home_id() -> str:
    """A gateway's home id: random, so a restarted replica (its store lost) has a new one."""
    return uuid.uuid4().hex[:HOME_CHARS]


def new_response_id(home_id: str) -> str:
    assert len(home_id) == HOME_CHARS, f"a home id has {HOME_CHARS} characters, got {home_id!r}"
    return f"{_PREFIX}{home_id}{uuid.uuid4().hex}"


def home_of(response_id: str) -> str | None:
    """The home id inside a response id; None for an id of another shape."""
    if not response_id.startswith(_PREFIX):
        return None
    home = response_id[len(_PREFIX) : len(_PREFIX) + HOME_CHARS]
    return home if len(home) == HOME_CHARS else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoredResponse:
    """One stored response: the object the create call answered, and its input items."""

    response_id: str
    response: bytes  # the response object's JSON, as POST /v1/responses answered it
    items: bytes  # the JSON array of its input items (its whole context, ids included)

    @property
    def num_bytes(self) -> int:
        return len(self.response) + len(self.items)

    def input_items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = _decode.decode(self.items)
        return items

    def context(self) -> list[dict[str, Any]]:
        """What a response continuing this one starts from: its input items, then its output."""
        output: list[dict[str, Any]] = _decode.decode(self.response)["output"]
        return [*self.input_items(), *output]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreStatistics:
    num_entries: int
    num_bytes: int
    num_evicted: int  # by either bound, since the start
    num_too_large: int  # entries larger than max_bytes on their own, not kept


class ResponseStore:
    """The stored responses of one gateway, bounded in entries and in bytes."""

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"store bounds must be >= 1, got {max_entries} and {max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()
        self._num_bytes = 0
        self._num_evicted = 0
        self._num_too_large = 0

    def put(self, entry: StoredResponse) -> bool:
        """Keep `entry` as the newest, evicting the oldest to stay in bounds; False (nothing
        kept) when it alone is larger than max_bytes."""
        if entry.num_bytes > self.max_bytes:
            self._num_too_large += 1
            return False
        self.delete(entry.response_id)  # ids are unique; a second put only replaces
        self._entries[entry.response_id] = entry
        self._num_bytes += entry.num_bytes
        while len(self._entries) > self.max_entries or self._num_bytes > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._num_bytes -= oldest.num_bytes
            self._num_evicted += 1
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._num_bytes -= entry.num_bytes
        return True

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            num_entries=len(self._entries),
            num_bytes=self._num_bytes,
            num_evicted=self._num_evicted,
            num_too_large=self._num_too_large,
        )
