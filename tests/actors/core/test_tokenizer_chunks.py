"""Chunked encoding: the same ids as a whole encode, for every tokenizer it accepts; an early
stop at the limit; whole encodes for tokenizers whose splitting it cannot vouch for."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors
from troupe.actors.core.tokenizer_chunks import ChunkedEncoder, LimitReached
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_gguf_pre import LLAMA3_REGEX, QWEN2_REGEX

# Text near every kind of cut: letter-space pairs, contractions, digits, punctuation runs,
# newlines, combining marks (NFC), chat tokens (added tokens), non-ASCII letters.
PIECES = [
    "word ",
    "ab",
    " ",
    "  ",
    "\n",
    "\n\n ",
    "'s",
    "don't ",
    "12345",
    "...",
    "!?",
    "é",
    "e\u0301",
    " \u0301",
    "中文",
    "<|im_start|>",
    "<|im_end|>",
    "a<|im_end|> ",
    "😀",
    "\t",
    "x",
]
texts = st.lists(st.sampled_from(PIECES), max_size=120).map("".join)


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    return load_tokenizer().tokenizer


def _variant(base: Tokenizer, regex: str, *, nfc: bool) -> Tokenizer:
    """The SmolLM2 vocabulary behind the Llama 3 or Qwen2 pre-tokenizer (as in their HF files)."""
    tokenizer = Tokenizer.from_str(base.to_str())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    return tokenizer


@pytest.fixture(scope="module")
def tokenizers(smol: Tokenizer) -> dict[str, Tokenizer]:
    with_bos = Tokenizer.from_str(smol.to_str())
    with_bos.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A <|im_end|>",
        special_tokens=[("<|im_start|>", 1), ("<|im_end|>", 2)],
    )
    return {
        "smollm2": smol,
        "smollm2+bos/eos": with_bos,
        "llama3": _variant(smol, LLAMA3_REGEX, nfc=False),
        "qwen2+nfc": _variant(smol, QWEN2_REGEX, nfc=True),
    }


@pytest.mark.parametrize("name", ["smollm2", "smollm2+bos/eos", "llama3", "qwen2+nfc"])
@settings(max_examples=150, deadline=None)
@given(text=texts, add_special_tokens=st.booleans())
def test_chunked_ids_equal_whole_ids(
    tokenizers: dict[str, Tokenizer], name: str, text: str, add_special_tokens: bool
) -> None:
    tokenizer = tokenizers[name]
    encoder = ChunkedEncoder(tokenizer, chunk_chars=8)  # a cut every few words
    assert encoder.is_chunkable
    whole = tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    assert encoder.encode(text, add_special_tokens=add_special_tokens) == whole


def test_cuts_are_made_and_avoid_added_tokens(smol: Tokenizer) -> None:
    encoder = ChunkedEncoder(smol, chunk_chars=4)
    assert list(encoder._cuts("aaaa bbbb cccc")) == [4, 9]  # "aaaa| bbbb| cccc"
    # No cut within 16 characters (the longest added token) of "<|im_end|>".
    assert list(encoder._cuts("aaaa bbbb<|im_end|> cccc dddd eeee")) == [29]


def test_stops_at_the_limit_after_at_most_one_more_chunk(smol: Tokenizer) -> None:
    text = "alpha beta gamma delta " * 50_000  # 200,000 tokens
    encoder = ChunkedEncoder(smol, chunk_chars=1_000)  # ~200 tokens per chunk
    result = encoder.encode(text, add_special_tokens=True, limit=1_000)
    assert isinstance(result, LimitReached)
    assert 1_000 <= result.num_tokens < 1_000 + 250
    under = encoder.encode(text[:4_000], add_special_tokens=True, limit=1_000)
    assert under == smol.encode(text[:4_000]).ids


@pytest.mark.parametrize(
    "change",
    [
        {"pre_tokenizer": pre_tokenizers.ByteLevel(add_prefix_space=True)},
        {"pre_tokenizer": pre_tokenizers.Metaspace()},
        {"pre_tokenizer": pre_tokenizers.ByteLevel(use_regex=False)},  # one pre-token
        {"pre_tokenizer": pre_tokenizers.Split(Regex(r"\w+ "), behavior="isolated")},
        {"normalizer": normalizers.Lowercase()},
    ],
)
def test_unvouched_tokenizers_are_encoded_whole(smol: Tokenizer, change: dict[str, object]) -> None:
    tokenizer = Tokenizer.from_str(smol.to_str())
    for name, value in change.items():
        setattr(tokenizer, name, value)
    encoder = ChunkedEncoder(tokenizer, chunk_chars=4)
    assert not encoder.is_chunkable
    text = "Hello brave new world, " * 20
    assert encoder.encode(text, add_special_tokens=True) == tokenizer.encode(text).ids
