"""TokenizerCore: an exception while tokenizing one request fails that request alone (a
RequestFailed for the streamer) and the core goes on; the others in the same batch get exactly
what they get without it, in inbox order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pytest
from troupe.actors.core.tokenizer import TokenizerCore
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.messages import (
    AbortRequest,
    ChatMessage,
    GenerateRequest,
    RequestFailed,
    RequestOpened,
    SamplingParams,
    TokenizedRequest,
)

BOMB = "kaboom"  # texts holding it make the tokenizer raise


class ExplodingTokenizer(TextTokenizer):
    """The real tokenizer, except that it raises on any text (or chat) holding BOMB."""

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        if any(BOMB in text for text in texts):
            raise RuntimeError("the Rust side exploded")
        return super().encode_batch(texts, add_special_tokens)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        if any(BOMB in str(m["content"]) for m in messages):
            raise KeyError("template variable exploded")
        return super().render_chat(messages, add_generation_prompt=add_generation_prompt, **extra)


def exploding(tok: TextTokenizer) -> ExplodingTokenizer:
    return ExplodingTokenizer(
        tok.tokenizer,
        source=tok.source,
        bos_token_id=tok.bos_token_id,
        eos_token_ids=tok.eos_token_ids,
        chat_template=tok.chat_template,
    )


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def _req(request_id: str, **kwargs: Any) -> GenerateRequest:
    params = SamplingParams(max_tokens=5)
    return GenerateRequest(request_id=request_id, params=params, arrival_time=1.0, **kwargs)


def _good_batch() -> list[GenerateRequest | AbortRequest]:
    return [
        _req("p1", prompt="Hello world"),
        _req("c1", messages=(ChatMessage(role="user", content="Hi there"),)),
        AbortRequest(request_id="gone"),
        _req("p2", prompt="Another prompt"),
        _req("t1", prompt_token_ids=(5, 6, 7)),
    ]


def _without_failures(out: list[tuple[str, msgspec.Struct]]) -> list[tuple[str, msgspec.Struct]]:
    return [(box, m) for box, m in out if not isinstance(m, RequestFailed)]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (_req("bad", prompt=f"a {BOMB} prompt"), "RuntimeError: the Rust side exploded"),
        (
            _req("bad", messages=(ChatMessage(role="user", content=BOMB),)),
            "KeyError: 'template variable exploded'",
        ),
    ],
    ids=["prompt", "chat"],
)
def test_one_request_that_makes_the_tokenizer_raise_fails_alone(
    tok: TextTokenizer, bad: GenerateRequest, error: str
) -> None:
    expected = TokenizerCore(tok).handle(_good_batch())
    core = TokenizerCore(exploding(tok))
    batch = _good_batch()
    batch.insert(2, bad)  # in the middle, between a prompt and a chat
    out = core.handle(batch)
    failures = [(i, m) for i, (_, m) in enumerate(out) if isinstance(m, RequestFailed)]
    assert len(failures) == 1
    index, failed = failures[0]
    assert out[index][0] == "streamer" and index == 4  # in inbox order: after p1's and c1's two
    assert failed == RequestFailed(
        request_id="bad", message=f"tokenizer failed on this request: {error}"
    )
    assert _without_failures(out) == expected  # the others: the same messages, the same order
    # The core goes on: the next batch is served as usual.
    assert core.handle(_good_batch()) == expected


def test_the_only_request_of_a_batch_fails_and_nothing_else_is_sent(tok: TextTokenizer) -> None:
    core = TokenizerCore(exploding(tok))
    out = core.handle([_req("bad", prompt=BOMB)])
    assert out == [
        (
            "streamer",
            RequestFailed(
                request_id="bad",
                message="tokenizer failed on this request: RuntimeError: the Rust side exploded",
            ),
        )
    ]
    opened, admitted = core.handle([_req("ok", prompt="Hello")])
    assert isinstance(opened[1], RequestOpened) and isinstance(admitted[1], TokenizedRequest)
