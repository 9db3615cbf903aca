"""The stored-responses core, without a server: the store's two bounds (entries, bytes) evict
the oldest, response ids name their home, a request's input becomes items with ids, duplicate
ids are refused by index, and input items page as OpenAI's cursor lists do."""

from __future__ import annotations

import argparse
import json

import pytest
from troupe.config import ConfigError
from troupe.gateway.errors import ApiError
from troupe.gateway.responses_history import check_unique_ids, item_page, stored_items
from troupe.gateway.responses_store import (
    HOME_CHARS,
    ResponseStore,
    StoredResponse,
    home_of,
    new_home_id,
    new_response_id,
)
from troupe.gateway.server import add_serve_arguments
from troupe.gateway.settings import GatewaySettings, settings_from_args


def _entry(response_id: str, size: int = 10) -> StoredResponse:
    response = json.dumps({"id": response_id, "output": [], "pad": "x" * size}).encode()
    return StoredResponse(response_id=response_id, response=response, items=b"[]")


def _ids(store: ResponseStore, ids: list[str]) -> list[str]:
    return [i for i in ids if store.get(i) is not None]


def test_the_entry_bound_evicts_the_oldest_and_reading_does_not_refresh() -> None:
    store = ResponseStore(max_entries=3, max_bytes=1 << 20)
    ids = [f"r{i}" for i in range(5)]
    for i in ids[:3]:
        assert store.put(_entry(i))
    assert store.get("r0") is not None  # read: still the oldest
    store.put(_entry("r3"))
    assert _ids(store, ids) == ["r1", "r2", "r3"]
    store.put(_entry("r4"))
    assert _ids(store, ids) == ["r2", "r3", "r4"]
    stats = store.statistics()
    assert (stats.num_entries, stats.num_evicted) == (3, 2)
    assert stats.num_bytes == sum(_entry(i).num_bytes for i in ("r2", "r3", "r4"))


def test_the_byte_bound_evicts_until_it_holds_and_a_too_large_entry_is_not_kept() -> None:
    one = _entry("a", 100).num_bytes
    store = ResponseStore(max_entries=100, max_bytes=2 * one + one // 2)
    for i in "abc":
        assert store.put(_entry(i, 100))
    assert _ids(store, list("abc")) == ["b", "c"]
    assert store.statistics().num_bytes == 2 * one <= store.max_bytes
    assert not store.put(_entry("huge", 10 * one))
    assert store.get("huge") is None and _ids(store, list("abc")) == ["b", "c"]
    assert store.statistics().num_too_large == 1


def test_delete_frees_its_bytes() -> None:
    store = ResponseStore(max_entries=4, max_bytes=1 << 20)
    store.put(_entry("a"))
    store.put(_entry("b"))
    assert store.delete("a") and not store.delete("a") and not store.delete("zzz")
    assert store.get("a") is None
    assert store.statistics().num_bytes == _entry("b").num_bytes


def test_a_response_id_names_its_home() -> None:
    home = new_home_id()
    assert len(home) == HOME_CHARS and home != new_home_id()
    response_id = new_response_id(home)
    assert response_id.startswith("resp_") and home_of(response_id) == home
    assert home_of("resp_short") is None and home_of("chatcmpl-1234567890abcdef") is None


def test_context_is_the_items_then_the_output() -> None:
    output = [{"id": "msg_out", "type": "message", "role": "assistant", "content": []}]
    entry = StoredResponse(
        response_id="r",
        response=json.dumps({"id": "r", "output": output}).encode(),
        items=json.dumps([{"id": "msg_in", "type": "message"}]).encode(),
    )
    assert [i["id"] for i in entry.context()] == ["msg_in", "msg_out"]


def test_stored_items_get_ids_and_content_parts() -> None:
    (text,) = stored_items("Hi")
    assert text["id"].startswith("msg_") and text["type"] == "message"
    assert (text["role"], text["content"]) == ("user", [{"type": "input_text", "text": "Hi"}])
    said, call, kept = stored_items(
        [
            {"role": "assistant", "content": "Yo"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"id": "msg_mine", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
        ]
    )
    assert said["content"][0]["type"] == "output_text" and said["content"][0]["text"] == "Yo"
    assert call["id"].startswith("fc_") and call["call_id"] == "c1"
    assert kept["id"] == "msg_mine" and kept["type"] == "message"


def test_duplicate_ids_are_named_by_their_input_index() -> None:
    items = [{"id": "a"}, {"id": "b"}, {"id": "c"}, {"id": "b"}]
    with pytest.raises(ApiError) as caught:
        check_unique_ids(items, num_history=2)  # a, b came from the earlier response
    assert caught.value.status == 400 and caught.value.param == "input[1].id"
    check_unique_ids(items[:3], num_history=2)


def test_pages_follow_order_limit_and_after() -> None:
    items = [{"id": f"i{n}"} for n in range(5)]

    def ids(page: dict[str, object]) -> list[str]:
        data = page["data"]
        assert isinstance(data, list)
        return [item["id"] for item in data]

    first = item_page(items, order="asc", limit=2, after=None)
    assert ids(first) == ["i0", "i1"] and first["has_more"] is True
    assert (first["first_id"], first["last_id"], first["object"]) == ("i0", "i1", "list")
    last = item_page(items, order="asc", limit=2, after="i3")
    assert ids(last) == ["i4"] and last["has_more"] is False
    desc = item_page(items, order="desc", limit=2, after="i3")
    assert ids(desc) == ["i2", "i1"] and desc["has_more"] is True
    whole = item_page(items, order="desc", limit=5, after=None)
    assert ids(whole) == ["i4", "i3", "i2", "i1", "i0"] and whole["has_more"] is False
    empty = item_page(items, order="asc", limit=3, after="i4")
    assert empty["data"] == [] and empty["first_id"] is None and empty["has_more"] is False
    with pytest.raises(ApiError) as caught:
        item_page(items, order="asc", limit=2, after="nope")
    assert caught.value.param == "after"


def test_the_store_settings_and_their_flags() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert settings_from_args(parser.parse_args([])).max_stored_responses == 0  # vLLM's: off
    args = parser.parse_args(["--max-stored-responses", "5", "--max-stored-response-bytes", "99"])
    settings = settings_from_args(args)
    assert (settings.max_stored_responses, settings.max_stored_response_bytes) == (5, 99)
    with pytest.raises(ConfigError, match="max_stored_responses"):
        GatewaySettings(max_stored_responses=-1)
    with pytest.raises(ConfigError, match="max_stored_response_bytes"):
        GatewaySettings(max_stored_response_bytes=0)
    with pytest.raises(ValueError, match="bounds"):
        ResponseStore(max_entries=0, max_bytes=1)
