"""Incremental detokenization is UTF-8 safe and agrees with tokenizer.decode."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from troupe.actors.core.detokenizer import IncrementalDetokenizer
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer

CORPUS = (
    "The quick brown fox 🦊 jumps over the lazy dog 🐶. Ünïcödé: 東京, München, Ελληνικά, "
    "русский, हिन्दी, 한국어, العربية. Emoji: 😀👍🏽🇫🇷👨‍👩‍👧 ✓ ✗ → ∑ ∞.\n"
    "def main():\n    print('hello')  # 42\n\t\treturn {\"a\": [1, 2]}\n"
    "<|im_start|>assistant\nSure!<|im_end|>"
)


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def test_emoji_split_over_tokens_waits_for_the_whole_char(tok: TextTokenizer) -> None:
    ids = tok.encode("Hi 😀!")
    assert ids == [26843, 40303, 218, 17]
    detok = IncrementalDetokenizer(tok)
    assert [detok.push(i) for i in ids] == ["Hi", " ", "😀", "!"]
    assert detok.flush() == ""


def test_cjk_three_tokens_per_char(tok: TextTokenizer) -> None:
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in [17097, 247, 126, 16736, 122]]
    assert deltas == [" ", "", "東", "", "京"]
    assert not detok.has_pending_bytes


def test_special_tokens_skipped_or_kept(tok: TextTokenizer) -> None:
    ids = tok.encode("ab<|im_end|>")
    assert IncrementalDetokenizer(tok).push_many(ids) == "ab"
    kept = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert kept.push_many(ids) == "ab<|im_end|>"


def test_unfinished_char_at_the_end_is_a_replacement_char(tok: TextTokenizer) -> None:
    detok = IncrementalDetokenizer(tok)
    assert detok.push(40303) == " "  # b" \xf0\x9f\x98": three of four bytes
    assert detok.has_pending_bytes
    assert detok.flush() == "\ufffd"
    assert tok.decode([40303]) == " \ufffd"  # the same as the tokenizer's own decode


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_deltas_concatenate_to_decode(tok: TextTokenizer, data: st.DataObject) -> None:
    corpus_ids = tok.encode(CORPUS)
    # A random window of real text, optionally shuffled with random vocabulary ids, so token
    # boundaries fall everywhere, including inside characters.
    start = data.draw(st.integers(0, len(corpus_ids) - 1))
    length = data.draw(st.integers(1, 40))
    ids = corpus_ids[start : start + length]
    if data.draw(st.booleans()):
        ids = data.draw(st.permutations(ids))
    ids = ids + data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=3))
    skip = data.draw(st.booleans())
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = [detok.push(i) for i in ids]
    final = detok.flush()
    expected = tok.decode(ids, skip_special_tokens=skip)
    if "\ufffd" not in expected:
        assert "".join(deltas) + final == expected
        for delta in deltas:
            assert "\ufffd" not in delta
            delta.encode("utf-8")  # no lone surrogates either
    else:
        assert "".join(deltas) + final == expected  # lossy the same way decode is


def test_shared_text_table_serves_many_requests_without_mixing_their_bytes(
    tok: TextTokenizer,
) -> None:
    from troupe.actors.core.detokenizer import TokenTexts

    texts = TokenTexts(tok)
    ids = tok.encode("Hi 😀! ok 😀")  # 40303 ends inside the emoji: it never enters the table
    a = IncrementalDetokenizer(tok, texts=texts)
    b = IncrementalDetokenizer(tok, texts=texts)
    out_a, out_b = [], []
    for i in ids:  # interleaved: b is mid-character whenever a is
        out_a.append(a.push(i))
        out_b.append(b.push(i))
    assert out_a == out_b == ["Hi", " ", "😀", "!", " ok", " ", "😀"]
    assert 40303 not in texts.texts and texts.texts[26843] == "Hi"
    assert IncrementalDetokenizer(tok, texts=texts).push(2) == ""  # special, skipped
    with pytest.raises(ValueError, match="skip_special_tokens"):
        IncrementalDetokenizer(tok, skip_special_tokens=False, texts=texts)


@pytest.mark.parametrize("first", [True, False])
def test_a_table_filled_from_the_other_skip_setting_equals_one_filled_alone(
    tok: TextTokenizer, first: bool
) -> None:
    from troupe.actors.core.detokenizer import TokenTexts

    def filled(skip: bool) -> TokenTexts:
        texts = TokenTexts(tok, skip_special_tokens=skip)
        texts.fill()
        return texts

    derived = TokenTexts(tok, skip_special_tokens=not first)
    derived.fill_from(filled(first))
    alone = filled(not first)
    assert derived.texts == alone.texts and derived._partial == alone._partial
    assert len(alone.texts) + len(alone._partial) == tok.vocab_size
    assert alone._partial and tok.special_ids  # both kinds of token are there to get wrong
    special = min(tok.special_ids)
    assert derived.texts[special] == ("<|endoftext|>" if first else "")
    # a fresh table decoded one token at a time agrees with the filled one
    lazy = TokenTexts(tok, skip_special_tokens=not first)
    assert all(lazy.text(i) == alone.texts.get(i) for i in range(0, tok.vocab_size, 97))
