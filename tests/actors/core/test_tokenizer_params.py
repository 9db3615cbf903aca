"""The tokenizer's share of two sampling fields, with the real SmolLM2 tokenizer: bad_words
turned into token ids as vLLM's update_from_tokenizer does, and truncate_prompt_tokens keeping
the prompt's last tokens for text, chat and token-id prompts, its bounds named."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from troupe.actors.core.tokenizer import TokenizerCore
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_params import bad_words_token_ids
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.messages import (
    ChatMessage,
    GenerateRequest,
    RequestOpened,
    RequestRejected,
    SamplingParams,
    TokenizedRequest,
)


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def _admitted(out: list[tuple[str, msgspec.Struct]]) -> TokenizedRequest:
    (opened,) = [m for box, m in out if isinstance(m, RequestOpened)]
    (admitted,) = [m for box, m in out if box == "admission"]
    assert isinstance(admitted, TokenizedRequest)
    assert opened.num_prompt_tokens == len(admitted.prompt_token_ids)
    assert opened.params == admitted.params
    return admitted


def _run(tok: TextTokenizer, max_model_len: int = 64, **kwargs: Any) -> list[Any]:
    params = kwargs.pop("params", SamplingParams())
    req = GenerateRequest(request_id="r", params=params, arrival_time=1.0, **kwargs)
    return TokenizerCore(tok, max_model_len=max_model_len).handle([req])


def test_bad_words_encode_with_and_without_a_space(tok: TextTokenizer) -> None:
    plain, spaced = tok.encode("Paris", False), tok.encode(" Paris", False)
    assert plain != spaced and len(plain) == len(spaced)  # byte-level BPE: two words
    assert bad_words_token_ids(tok, ["  Paris"]) == (tuple(plain), tuple(spaced))
    # a spaced form of another length is dropped (vLLM's rule)
    word = "Parisianism"
    ids = bad_words_token_ids(tok, [word])
    spaced_ids = tok.encode(" " + word, False)
    expected = [tuple(tok.encode(word, False))]
    if len(spaced_ids) == len(expected[0]) and spaced_ids[0] != expected[0][0]:
        expected.append(tuple(spaced_ids))
    assert ids == tuple(expected)


def test_the_tokenizer_fills_the_ids(tok: TextTokenizer) -> None:
    sent = SamplingParams(bad_words=("Paris",), bad_words_token_ids=((1, 2, 3),))
    params = _admitted(_run(tok, prompt="Hi", params=sent)).params
    assert params.bad_words_token_ids == bad_words_token_ids(tok, ["Paris"])
    cleared = SamplingParams(bad_words_token_ids=((1, 2, 3),))  # no words: nothing to ban
    assert _admitted(_run(tok, prompt="Hi", params=cleared)).params.bad_words_token_ids == ()


def test_truncation_keeps_the_last_tokens(tok: TextTokenizer) -> None:
    text = "The capital of France is Paris and the capital of Spain is Madrid"
    ids = tok.encode(text, True)
    keep = SamplingParams(truncate_prompt_tokens=4)
    assert _admitted(_run(tok, prompt=text, params=keep)).prompt_token_ids == tuple(ids[-4:])
    tokens = _admitted(_run(tok, prompt_token_ids=tuple(ids), params=keep))
    assert tokens.prompt_token_ids == tuple(ids[-4:])
    messages = (ChatMessage(role="user", content=text),)
    whole = _admitted(_run(tok, messages=messages)).prompt_token_ids
    cut = _admitted(_run(tok, messages=messages, params=keep)).prompt_token_ids
    assert cut == whole[-4:] and len(whole) > 4
    # a prompt longer than max_model_len is no error when its tail fits
    long = " ".join(["word"] * 200)
    tail = _admitted(_run(tok, prompt=long, params=SamplingParams(truncate_prompt_tokens=8)))
    assert tail.prompt_token_ids == tuple(tok.encode(long, True)[-8:])
    everything = _admitted(_run(tok, prompt="Hi", params=SamplingParams(truncate_prompt_tokens=-1)))
    assert everything.prompt_token_ids == tuple(tok.encode("Hi", True))


@pytest.mark.parametrize("k", [0, -2, 65])
def test_truncation_bounds_are_named(tok: TextTokenizer, k: int) -> None:
    (out,) = _run(tok, prompt="Hi", params=SamplingParams(truncate_prompt_tokens=k))
    box, rejected = out
    assert box == "streamer" and isinstance(rejected, RequestRejected)
    assert rejected.field == "truncate_prompt_tokens"
    assert ("max_model_len (64)" in rejected.message) == (k == 65)
