"""The cheap lower bound on token counts: never above the real count, tight on the worst cases,
absent where no safe bound exists."""

from __future__ import annotations

import functools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
from troupe.actors.core.tokenizer_bound import (
    _SHRINK,
    TokenCountBound,
    _shrink_factor,
    _state,
    token_count_bound,
)
from troupe.actors.core.tokenizer_files import load_tokenizer

# Pieces that stress the bound: the longest tokens (80 '#', newline + 80 spaces), the token with
# the most letters, bytes SmolLM2 drops, chat tokens, non-ASCII, digits.
PIECES = [
    "#" * 80,
    "\n" + " " * 80,
    "ManagementPlaneProtection",
    " NotImplementedError",
    "\x04",
    "\x1d",
    "<|im_start|>",
    "é",
    "e\u0301",
    "\u1100\u1161\u11a8",
    "中文",
    "😀",
    "12345",
    " ",
    "a",
    "\U00050000",
]
texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=40).map("".join)


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    return load_tokenizer().tokenizer


@pytest.fixture(scope="module")
def nfc(smol: Tokenizer) -> Tokenizer:
    return _with(smol, normalizer=normalizers.NFC())


@functools.cache
def _bound(tokenizer: Tokenizer) -> TokenCountBound:
    """token_count_bound, once per tokenizer: hypothesis calls a test hundreds of times."""
    bound = token_count_bound(tokenizer)
    assert bound is not None
    return bound


def _with(base: Tokenizer, **parts: object) -> Tokenizer:
    tokenizer = Tokenizer.from_str(base.to_str())
    for name, value in parts.items():
        setattr(tokenizer, name, value)
    return tokenizer


def test_smollm2_bound_is_its_longest_token_and_most_letters(smol: Tokenizer) -> None:
    bound = token_count_bound(smol)
    assert bound == TokenCountBound(
        bytes_per_token=81, uncounted=b"\x04\x06\x13\x14\x16\x1d\xf1\xf2", letters_per_token=25
    )
    assert smol.encode("\x04" * 100).ids == []  # why those bytes are not counted


@settings(max_examples=300, deadline=None)
@given(text=texts)
def test_bound_never_exceeds_the_real_count(smol: Tokenizer, text: str) -> None:
    bound = _bound(smol)
    assert bound.min_tokens(text) <= len(smol.encode(text, add_special_tokens=False).ids)


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_bound_holds_under_nfc(nfc: Tokenizer, text: str) -> None:
    bound = _bound(nfc)
    assert bound.bytes_per_token == 3 * 81
    assert bound.letters_per_token is None  # NFC can fold ASCII letters away
    assert bound.min_tokens(text) <= len(nfc.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\n" + " " * 80, 1),  # the longest token, 81 bytes: the byte bound is exact
        ("ManagementPlaneProtection" * 4, 4),  # the letter bound is exact
        ("\x04" * 1000 + "a", 1),  # dropped bytes count nothing
    ],
)
def test_bound_is_tight_on_the_worst_cases(smol: Tokenizer, text: str, expected: int) -> None:
    bound = token_count_bound(smol)
    assert bound is not None
    assert bound.min_tokens(text) == expected
    assert len(smol.encode(text, add_special_tokens=False).ids) == expected


def test_lone_surrogate_raises_unicode_error(smol: Tokenizer) -> None:
    bound = token_count_bound(smol)
    assert bound is not None
    with pytest.raises(UnicodeEncodeError):
        bound.min_tokens("ab\ud800")


def test_normalizer_shrink_factors_hold_for_every_code_point() -> None:
    # "\0" separates the code points: a starter that composes with nothing, so each segment
    # is normalized on its own, in one call.
    code_points = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000]
    for name, normalizer in [
        ("NFC", normalizers.NFC()),
        ("NFD", normalizers.NFD()),
        ("NFKC", normalizers.NFKC()),
        ("NFKD", normalizers.NFKD()),
        ("Lowercase", normalizers.Lowercase()),
    ]:
        out = normalizer.normalize_str("\0".join(code_points)).split("\0")
        assert len(out) == len(code_points)
        worst = max(
            len(c.encode()) / len(o.encode()) for c, o in zip(code_points, out, strict=True)
        )
        assert worst <= _SHRINK[name], name
        assert worst == _SHRINK[name], f"{name}: the factor could be tighter"


def test_sequences_multiply_and_unsafe_normalizers_have_no_factor() -> None:
    seq = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    assert _shrink_factor(_state(seq)) == 9
    assert _shrink_factor(_state(normalizers.Replace("abc", "x"))) == 3
    assert _shrink_factor(_state(normalizers.Replace(" ", "▁"))) == 1
    assert _shrink_factor(_state(normalizers.Strip())) is None
    assert _shrink_factor(_state(normalizers.StripAccents())) is None
    assert _shrink_factor(_state(normalizers.Replace("x", ""))) is None


def test_no_bound_where_one_token_can_cover_unbounded_text(smol: Tokenizer) -> None:
    word_piece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert token_count_bound(word_piece) is None  # a whole unknown word is one [UNK]
    assert token_count_bound(_with(smol, pre_tokenizer=pre_tokenizers.Whitespace())) is None
    assert token_count_bound(_with(smol, normalizer=normalizers.Strip())) is None
    truncating = _with(smol)
    truncating.enable_truncation(16)
    assert token_count_bound(truncating) is None
    stripping = _with(smol)
    stripping.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    assert token_count_bound(stripping) is None  # "<mask>" swallows the spaces before it


def test_byte_fallback_bpe_counts_normalized_bytes() -> None:
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab.update({"▁": 256, "h": 257, "i": 258, "hi": 259, "▁hi": 260})
    model = models.BPE(vocab, [("h", "i"), ("▁", "hi")], byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    bound = token_count_bound(tokenizer)
    # "<0xFF>" is the longest (6 bytes) and holds the most ASCII letters (x, F, F).
    assert bound == TokenCountBound(bytes_per_token=6, uncounted=b"", letters_per_token=3)
    for text in ("hi hi hi", "ß" * 40, "x" * 7, " hi" * 30):
        num_tokens = len(tokenizer.encode(text).ids)
        assert bound.min_tokens(text) <= num_tokens
    assert bound.min_tokens("ß" * 40) == math.ceil(80 / 6)
