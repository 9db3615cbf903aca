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
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from troupe.actors.core.tokenizer_text import TextTokenizer


class IncrementalDetokenizer:
    """Turns a request's output token ids into text deltas, one call per batch of tokens."""

    def __init__(self, tokenizer: TextTokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_ids = tokenizer.special_ids if skip_special_tokens else frozenset()
        # errors="replace": invalid bytes (not merely incomplete ones) print U+FFFD, exactly as
        # the tokenizer's own decode does, so the stream and decode(all ids) agree.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text that token `token_id` completes (often "", never half a character)."""
        if token_id in self._skip_ids:
            return ""
        return str(self._decoder.decode(self._tokenizer.token_bytes(token_id)))

    def push_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.push(token_id) for token_id in token_ids)

    def flush(self) -> str:
        """At the end of the stream: bytes that never completed a character become U+FFFD."""
        return str(self._decoder.decode(b"", final=True))

    @property
    def has_pending_bytes(self) -> bool:
        """True while the last tokens ended inside a multi-byte character."""
        pending, _ = self._decoder.getstate()
        return bool(pending)
