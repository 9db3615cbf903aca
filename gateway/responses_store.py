"""Stored responses (OpenAI's `store`): a bounded in-memory map from response id to the
response object and the items that made it, owned by one gateway app (its Gateway).

    put(entry) ─► appended as the newest; then the oldest are evicted until both bounds hold:
                  at most `max_entries` entries and `max_bytes` bytes (an entry larger than
                  `max_bytes` on its own is not kept). `is_running`: a background response
                  still running, never evicted (its run puts it again when it ends); the
                  gateway runs at most `max_entries` at once, so they alone never pass the
                  entry bound (their small objects may pass the byte bound until they end)
    replace(entry) ─► put, only while `entry`'s id is held (a run deleted meanwhile stays gone)
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
    events: bytes = b""  # a finished background response's events (a JSON array) to replay

    @property
    def num_bytes(self) -> int:
        return len(self.response) + len(self.items) + len(self.events)

    def stream_events(self) -> list[dict[str, Any]]:
        """The events GET ?stream=true replays (none for a response not run in background)."""
        events: list[dict[str, Any]] = _decode.decode(self.events) if self.events else []
        return events

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
    num_running: int  # background responses still running (never evicted)


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
        self._running: set[str] = set()

    def put(self, entry: StoredResponse, *, is_running: bool = False) -> bool:
        """Keep `entry` as the newest, evicting the oldest finished ones to stay in bounds;
        False (nothing kept) when it alone is larger than max_bytes."""
        if entry.num_bytes > self.max_bytes:
            self._num_too_large += 1
            self.delete(entry.response_id)  # a run's placeholder does not outlive its end
            return False
        self.delete(entry.response_id)  # ids are unique; a second put only replaces
        self._entries[entry.response_id] = entry
        self._num_bytes += entry.num_bytes
        if is_running:
            self._running.add(entry.response_id)
        evictable = (k for k in list(self._entries) if k not in self._running)
        while len(self._entries) > self.max_entries or self._num_bytes > self.max_bytes:
            oldest_id = next(evictable, None)
            if oldest_id is None:  # only running ones left: they end, then the bound holds
                break
            oldest = self._entries.pop(oldest_id)
            self._num_bytes -= oldest.num_bytes
            self._num_evicted += 1
        return True

    def replace(self, entry: StoredResponse) -> bool:
        """`put` (as finished), only while the store holds `entry`'s id."""
        if entry.response_id not in self._entries:
            return False
        return self.put(entry)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._num_bytes -= entry.num_bytes
        self._running.discard(response_id)
        return True

    @property
    def num_running(self) -> int:
        return len(self._running)

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(
            num_entries=len(self._entries),
            num_bytes=self._num_bytes,
            num_evicted=self._num_evicted,
            num_too_large=self._num_too_large,
            num_running=len(self._running),
        )
