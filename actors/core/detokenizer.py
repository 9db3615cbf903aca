"""Incremental detokenization that never splits a UTF-8 character.

Byte-level BPE tokens are byte strings, and one character may span several tokens (an emoji is
often 2-4 tokens). Decoding token by token would print U+FFFD for each fragment, so we work on
bytes: every token's bytes go through an incremental UTF-8 decoder, which returns only complete
characters and keeps an incomplete tail until the next token completes it.

    tokens   "Hi"  " \\xf0\\x9f"  "\\x98"  "\\x80!"
    deltas   "Hi"  " "           ""       "😀!"

Because the decoder sees the output bytes alone, the concatenated deltas equal
`tokenizer.decode(output_ids)`. No prompt context is needed: byte-level and SentencePiece
byte-fallback tokens carry their own spaces, so a token's bytes do not depend on its neighbours.

The hot path skips the decoder: while no character is pending, a token whose bytes are complete
UTF-8 on their own decodes to the same text every time, so that text is cached per token id
(in a `TokenTexts` that every request with the same tokenizer and skip setting shares).
"""

from __future__ import annotations

import codecs
import weakref
from collections.abc import Iterable

from troupe.actors.core.tokenizer_text import TextTokenizer


class TokenTexts:
    """Token id -> its text, for tokens that decode alone (complete, valid UTF-8); skipped
    special tokens map to "". Filled lazily; share one per (tokenizer, skip_special_tokens)."""

    def __init__(self, tokenizer: TextTokenizer, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.skip_ids = tokenizer.special_ids if skip_special_tokens else frozenset()
        self.texts: dict[int, str] = {}
        self._partial: set[int] = set()  # tokens whose bytes need the incremental decoder

    def text(self, token_id: int) -> str | None:
        """The token's text if it decodes alone (cached from then on), else None."""
        if token_id in self._partial:
            return None
        if token_id in self.skip_ids:
            text = ""
        else:
            try:
                text = self.tokenizer.token_bytes(token_id).decode("utf-8")
            except UnicodeDecodeError:
                self._partial.add(token_id)
                return None
        self.texts[token_id] = text
        return text

    def fill(self) -> None:
        """Decode every id of the vocabulary now (a few tens of ms), not on the hot path."""
        texts, partial, skip_ids = self.texts, self._partial, self.skip_ids
        for token_id, data in enumerate(self.tokenizer.all_token_bytes()):
            if token_id in texts or token_id in partial:
                continue
            if token_id in skip_ids:
                texts[token_id] = ""
                continue
            try:
                texts[token_id] = data.decode("utf-8")
            except UnicodeDecodeError:
                partial.add(token_id)

    def fill_from(self, other: TokenTexts) -> None:
        """Fill from `other` (the same tokenizer, the other skip setting): its texts, the
        special ids of either setting decoded anew (half the work of fill())."""
        if other.tokenizer is not self.tokenizer:
            raise ValueError("fill_from needs a TokenTexts of the same tokenizer")
        redo = other.skip_ids | self.skip_ids
        self.texts.update((i, t) for i, t in other.texts.items() if i not in redo)
        self._partial.update(i for i in other._partial if i not in redo)
        for token_id in redo:
            self.text(token_id)


# A memo of a pure function (token id -> text), so sharing it between cores shares no state
# anyone can observe; one per tokenizer object (loaded once per process) and skip setting.
_shared: weakref.WeakKeyDictionary[TextTokenizer, dict[bool, TokenTexts]] = (
    weakref.WeakKeyDictionary()
)


def shared_token_texts(tokenizer: TextTokenizer, *, skip_special_tokens: bool) -> TokenTexts:
    """The process-wide, fully decoded TokenTexts of this tokenizer and skip setting."""
    tables = _shared.setdefault(tokenizer, {})
    texts = tables.get(skip_special_tokens)
    if texts is None:
        texts = TokenTexts(tokenizer, skip_special_tokens=skip_special_tokens)
        other = tables.get(not skip_special_tokens)
        if other is not None:
            texts.fill_from(other)
        else:
            texts.fill()
        tables[skip_special_tokens] = texts
    return texts


class IncrementalDetokenizer:
    """Turns a request's output token ids into text deltas, one call per batch of tokens."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        *,
        skip_special_tokens: bool = True,
        texts: TokenTexts | None = None,
    ) -> None:
        if texts is None:
            texts = TokenTexts(tokenizer, skip_special_tokens=skip_special_tokens)
        elif texts.tokenizer is not tokenizer or texts.skip_special_tokens != skip_special_tokens:
            raise ValueError("texts was built for another tokenizer or skip_special_tokens")
        self._tokenizer = tokenizer
        self._texts = texts
        self._cached = texts.texts
        self._skip_ids = texts.skip_ids
        # errors="replace": invalid bytes (not merely incomplete ones) print U+FFFD, exactly as
        # the tokenizer's own decode does, so the stream and decode(all ids) agree.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = False  # the decoder holds bytes of an incomplete character

    def push(self, token_id: int) -> str:
        """The text that token `token_id` completes (often "", never half a character)."""
        if not self._pending:
            text = self._cached.get(token_id)
            if text is not None:
                return text
            text = self._texts.text(token_id)
            if text is not None:
                return text
        elif token_id in self._skip_ids:
            return ""
        text = str(self._decoder.decode(self._tokenizer.token_bytes(token_id)))
        self._pending = bool(self._decoder.getstate()[0])
        return text

    def push_many(self, token_ids: Iterable[int]) -> str:
        return "".join([self.push(token_id) for token_id in token_ids])

    def flush(self) -> str:
        """At the end of the stream: bytes that never completed a character become U+FFFD."""
        self._pending = False
        return str(self._decoder.decode(b"", final=True))

    @property
    def has_pending_bytes(self) -> bool:
        """True while the last tokens ended inside a multi-byte character."""
        pending, _ = self._decoder.getstate()
        return bool(pending)
