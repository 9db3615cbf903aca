"""A stored response's input items: as OpenAI lists them (each with an `id`, a message's
content as parts), checked for duplicate ids, and read a page at a time.

    "Hi"                                  ->  {"id": "msg_...", "type": "message", "role": "user",
                                               "content": [{"type": "input_text", "text": "Hi"}]}
    {"role": "assistant", "content": "Yo"} ->  ... "content": [{"type": "output_text", ...}]
    an item with an id                    ->  as sent (its `type` filled in)

The items are read again as the `input` of a response that continues this one, so they keep
the fields the request's item Structs accept (gateway/responses_bodies.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from troupe.gateway.errors import invalid
from troupe.gateway.responses_objects import new_id, output_text

_ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}
MAX_PAGE = 100  # OpenAI's: limit is 1..100, 20 when left out
DEFAULT_PAGE = 20
Order = Literal["asc", "desc"]


def stored_items(input_: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's `input` (already checked) as the items it stores."""
    raw = [{"role": "user", "content": input_}] if isinstance(input_, str) else input_
    return [_stored(item) for item in raw]


def check_unique_ids(items: Sequence[dict[str, Any]], num_history: int) -> None:
    """A 400 naming the first input item whose id an earlier item has (OpenAI's rule: a
    client continuing a response with previous_response_id sends only the new items)."""
    seen: set[str] = set()
    for i, item in enumerate(items):
        item_id = item["id"]
        if item_id in seen:
            where = f"input[{i - num_history}].id"
            raise invalid(
                where,
                f"Duplicate item found with id {item_id!r:.80}: remove duplicate items from "
                "your input (previous_response_id brings the earlier response's items)",
            )
        seen.add(item_id)


def item_page(
    items: list[dict[str, Any]], *, order: Order, limit: int, after: str | None
) -> dict[str, Any]:
    """One page of `items` in `order`, after the item whose id is `after` (OpenAI's list)."""
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise invalid("after", f"after: no input item of this response has id {after!r:.80}")
        start = ids.index(after) + 1
    page = ordered[start : start + limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(ordered),
    }


def _stored(raw: dict[str, Any]) -> dict[str, Any]:
    kind = raw.get("type", "message")
    item = {"type": kind, **raw}
    if item.get("id") is None:
        item["id"] = new_id(_ID_PREFIXES[kind])
    content = item.get("content")
    if kind == "message" and isinstance(content, str):
        if item["role"] == "assistant":
            item["content"] = [output_text(content)]
        else:
            item["content"] = [{"type": "input_text", "text": content}]
    return item
