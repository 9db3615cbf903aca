"""The dead-end cause's fields decode from messages recorded before they existed (old traces)."""

from __future__ import annotations

import msgspec
from troupe.messages import Failed, FailedSeq, FailureCause, SeqFailureReason, TokenMasks


def _without(data: bytes, key: str) -> bytes:
    fields = msgspec.msgpack.decode(data)
    del fields[key]
    return msgspec.msgpack.encode(fields)


def test_old_messages_decode_with_the_defaults() -> None:
    failed = Failed(request_id="r", message="m", cause=FailureCause.GRAMMAR_DEAD_END)
    old = _without(msgspec.msgpack.encode(failed), "cause")
    assert msgspec.msgpack.decode(old, type=Failed).cause is FailureCause.INTERNAL
    masks = TokenMasks(step_id=1, request_ids=("r",), num_words=1, bitmask=bytes(4))
    old = _without(
        msgspec.msgpack.encode(msgspec.structs.replace(masks, dead_ends=("r",))), "dead_ends"
    )
    assert msgspec.msgpack.decode(old, type=TokenMasks) == masks
    row = msgspec.msgpack.encode(["r", "structured output failed"])  # array_like, no detail
    assert msgspec.msgpack.decode(row, type=FailedSeq) == FailedSeq("r", SeqFailureReason.GRAMMAR)
