"""gateway/sse_frames.py: the text-delta fast path gives the general path's bytes."""

from __future__ import annotations

import json

import pytest
from troupe.gateway.openai_responses import ResponseBuilder
from troupe.gateway.sse_frames import _MARKER, sse, text_delta_frames

TEXTS = [" hi", 'a "quote", a \\ and a /', "line\nbreak\ttab", "é 漢字 🙂", "\x00\x1f", _MARKER]


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("model", ["Qwen3-0.6B", f"odd{_MARKER}model"])
def test_a_templated_frame_is_the_general_frame(kind: str, model: str) -> None:
    builder = ResponseBuilder(kind, model, "cmpl-1", None)
    frames = text_delta_frames(builder)
    assert frames is not None
    for index in (0, 2, 1):
        for text in TEXTS:
            frame = frames.frame(text, index)
            assert frame == sse(builder.delta_chunk(text, None, index=index))
            chunk = json.loads(frame.removeprefix("data: "))
            choice = chunk["choices"][0]
            assert choice["index"] == index
            assert (choice["delta"]["content"] if kind == "chat" else choice["text"]) == text


def test_running_usage_takes_the_general_path() -> None:
    builder = ResponseBuilder("chat", "m", "cmpl-1", None, continuous_usage=True)
    assert text_delta_frames(builder) is None
