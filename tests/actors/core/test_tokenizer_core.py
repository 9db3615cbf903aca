"""TokenizerCore with the real SmolLM2 tokenizer: exact ids, exact messages, exact order."""

from __future__ import annotations

from typing import Any

import pytest
from troupe.actors.core.tokenizer import TokenizerCore
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.messages import (
    AbortRequest,
    ChatMessage,
    GenerateRequest,
    RejectCode,
    RequestOpened,
    RequestRejected,
    SamplingParams,
    TokenizedRequest,
)

PARAMS = SamplingParams(max_tokens=5, temperature=0.0)


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


@pytest.fixture
def core(tok: TextTokenizer) -> TokenizerCore:
    return TokenizerCore(tok)


def _req(request_id: str, **kwargs: Any) -> GenerateRequest:
    return GenerateRequest(request_id=request_id, params=PARAMS, arrival_time=10.5, **kwargs)


def test_prompt_opens_then_admits(core: TokenizerCore) -> None:
    out = core.handle([_req("r1", prompt="Hello world")])
    assert out == [
        (
            "streamer",
            RequestOpened(
                request_id="r1",
                params=PARAMS,
                num_prompt_tokens=2,
                prompt_tail_ids=(19556, 905),
                arrival_time=10.5,
            ),
        ),
        (
            "admission",
            TokenizedRequest(
                request_id="r1", prompt_token_ids=(19556, 905), params=PARAMS, arrival_time=10.5
            ),
        ),
    ]


def test_chat_is_rendered_and_not_given_special_tokens_twice(
    core: TokenizerCore, tok: TextTokenizer
) -> None:
    messages = (ChatMessage(role="user", content="Hi"),)
    out = core.handle([_req("c", messages=messages)])
    text = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tuple(tok.encode(text, add_special_tokens=False))
    assert ids[0] == 1 and ids[1] != 1  # <|im_start|> once, from the template
    assert ids[-4:] == (1, 520, 9531, 198)  # "<|im_start|>assistant\n"
    admitted = out[1][1]
    assert isinstance(admitted, TokenizedRequest) and admitted.prompt_token_ids == ids
    opened = out[0][1]
    assert isinstance(opened, RequestOpened)
    assert opened.num_prompt_tokens == len(ids) and opened.prompt_tail_ids == ids[-8:]
    no_gen = core.handle([_req("c2", messages=messages, add_generation_prompt=False)])
    admitted2 = no_gen[1][1]
    assert isinstance(admitted2, TokenizedRequest)
    assert admitted2.prompt_token_ids == ids[:-4]


def test_prompt_token_ids_pass_through_and_are_checked(core: TokenizerCore) -> None:
    out = core.handle([_req("t", prompt_token_ids=(0, 5, 49151))])
    admitted = out[1][1]
    assert isinstance(admitted, TokenizedRequest) and admitted.prompt_token_ids == (0, 5, 49151)
    (bad,) = core.handle([_req("t2", prompt_token_ids=(3, 49152))])
    assert bad == (
        "streamer",
        RequestRejected(
            request_id="t2",
            code=RejectCode.INVALID_REQUEST,
            message="prompt_token_ids[1] = 49152 is outside the vocabulary [0, 49152)",
            field="prompt_token_ids",
        ),
    )
    (neg,) = core.handle([_req("t3", prompt_token_ids=(-1,))])
    assert isinstance(neg[1], RequestRejected) and neg[1].field == "prompt_token_ids"


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"prompt": ""}, "prompt", "prompt must not be empty"),
        ({}, "prompt", "exactly one of prompt, messages, prompt_token_ids must be set (got none)"),
        ({"prompt": "a", "prompt_token_ids": (1,)}, "prompt", "(got prompt, prompt_token_ids)"),
        ({"messages": ()}, "messages", "messages must not be empty"),
        ({"prompt_token_ids": ()}, "prompt_token_ids", "prompt_token_ids must not be empty"),
    ],
)
def test_bad_requests_are_rejected_naming_the_field(
    core: TokenizerCore, kwargs: dict[str, object], field: str, fragment: str
) -> None:
    (out,) = core.handle([_req("bad", **kwargs)])
    outbox, msg = out
    assert outbox == "streamer" and isinstance(msg, RequestRejected)
    assert msg.code == RejectCode.INVALID_REQUEST and msg.field == field
    assert fragment in msg.message


def test_chat_without_template_is_rejected(tok: TextTokenizer) -> None:
    no_template = load_tokenizer()
    no_template.chat_template = None
    (out,) = TokenizerCore(no_template).handle(
        [_req("x", messages=(ChatMessage(role="user", content="hi"),))]
    )
    assert isinstance(out[1], RequestRejected) and out[1].field == "messages"
    assert "has no chat template" in out[1].message


def test_batch_keeps_inbox_order_and_forwards_aborts(core: TokenizerCore) -> None:
    abort = AbortRequest(request_id="a", reason="gone")
    out = core.handle(
        [
            _req("a", prompt="one"),
            abort,
            _req("b", prompt=""),
            _req("c", messages=(ChatMessage(role="user", content="two"),)),
            _req("d", prompt="three"),
        ]
    )
    route = [(box, type(msg).__name__, getattr(msg, "request_id", None)) for box, msg in out]
    assert route == [
        ("streamer", "RequestOpened", "a"),
        ("admission", "TokenizedRequest", "a"),
        ("admission", "AbortRequest", "a"),
        ("streamer", "RequestRejected", "b"),
        ("streamer", "RequestOpened", "c"),
        ("admission", "TokenizedRequest", "c"),
        ("streamer", "RequestOpened", "d"),
        ("admission", "TokenizedRequest", "d"),
    ]
    assert out[2][1] is abort
    three = out[7][1]
    assert isinstance(three, TokenizedRequest) and three.prompt_token_ids == (16347,)


def test_vocab_size_override_is_the_limit(tok: TextTokenizer) -> None:
    (out,) = TokenizerCore(tok, vocab_size=100).handle([_req("v", prompt_token_ids=(100,))])
    assert isinstance(out[1], RequestRejected)
    assert out[1].message.endswith("[0, 100)")
