"""A lower bound on a text's token count that costs one pass over its length, not a tokenization.

A prompt of megabytes must not be tokenized in full only to learn that it is too long (a 3.9 MB
prompt is ~975,000 SmolLM2 tokens: seconds of CPU and gigabytes of encodings). Every token a
BPE tokenizer emits covers at most L bytes of the text it was given, where L is the longest
token in the vocabulary, so a text of B bytes has at least ceil(B / L) tokens. Three things can
break that and are accounted for:

- a normalizer may shrink the text before the model sees it (NFC turns the 3-byte U+1FEF into
  the 1-byte "`"): B is divided by the normalizer's worst shrink factor S;
- an unknown-token fallback can swallow any number of bytes into one token: only byte-level
  BPE and BPE with a complete byte fallback have none;
- added tokens that strip whitespace around them (lstrip/rstrip) cover unbounded runs, and a
  pre-tokenizer that removes text (Whitespace, Split "removed") drops bytes from the count.

Where the bound cannot be made safe, `max_bytes_per_token` is None and no text is rejected by
it: tokenization then decides, as before. The bound only ever rejects texts that admission
would reject after tokenizing them.
"""

from __future__ import annotations

import json
import math
import string
import weakref
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers
from troupe.actors.core.tokenizer_text import TextTokenizer, byte_level_alphabet

# Worst ratio of UTF-8 bytes in / bytes out of one normalizer, over every input. Single code
# points (checked exhaustively in the tests): NFC/NFD 3 (U+1FEF -> "`"), NFKC/NFKD 4
# (U+1D400 -> "A"), Lowercase 3 (U+212A KELVIN SIGN -> "k"). Composition does no worse:
# Hangul L+V+T jamo (9 bytes) compose to one 3-byte syllable.
_SHRINK = {"NFC": 3, "NFD": 3, "NFKC": 4, "NFKD": 4, "Lowercase": 3, "Prepend": 1}
_LETTERS = string.ascii_letters.encode()
# Bytes no UTF-8 text contains: nothing to count for them.
_NEVER_IN_UTF8 = frozenset((0xC0, 0xC1, *range(0xF5, 0x100)))
# Pre-tokenizers that only split (or grow) the text, never drop any of it.
_KEEPS_TEXT = ("ByteLevel", "Digits", "Metaspace", "Split", "Sequence")


@dataclass(frozen=True)
class TokenCountBound:
    """The fewest tokens a text can encode to, from counts of its bytes alone."""

    bytes_per_token: int  # S * L: no token stands for more bytes of the input
    # Bytes missing from a byte-level vocabulary: the model drops them (SmolLM2 has no token
    # for \x04), so they may cost no token at all and are not counted.
    uncounted: bytes = b""
    letters_per_token: int | None = None  # A; None: the letter bound does not hold

    def min_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)). Raises UnicodeEncodeError on a lone surrogate."""
        if self.letters_per_token is None and not self.uncounted and text.isascii():
            return math.ceil(len(text) / self.bytes_per_token)  # no copy of a long string
        # bytes.translate is one fast pass in C: ~2 ms for 4 MB (str.count: 2 ms per char).
        data = text.encode("utf-8")
        num_bytes = len(data.translate(None, self.uncounted)) if self.uncounted else len(data)
        bound = math.ceil(num_bytes / self.bytes_per_token)
        if self.letters_per_token is not None:
            bound = max(bound, math.ceil(_num_letters(data) / self.letters_per_token))
        return bound


def token_count_bound(tokenizer: Tokenizer) -> TokenCountBound | None:
    """The bound for `tokenizer`, or None where no safe one exists (see the module doc)."""
    if tokenizer.truncation is not None:  # a truncating tokenizer caps the count itself
        return None
    shrink = _shrink_factor(_state(tokenizer.normalizer))
    model = _model_bound(tokenizer)
    if shrink is None or model is None:
        return None
    longest, uncounted, vocab = model
    added_texts = []  # added tokens cover their own text
    for added in tokenizer.get_added_tokens_decoder().values():
        if added.lstrip or added.rstrip:  # swallows the whitespace run beside it
            return None
        longest = max(longest, len(added.content.encode()))
        added_texts.append(added.content)
    letters = None
    if tokenizer.normalizer is None and not any(b in _LETTERS for b in uncounted):
        letters = max(_num_letters(token.encode()) for token in (*vocab, *added_texts))
    return TokenCountBound(shrink * longest, uncounted, letters)


# A memo of a pure function of the tokenizer (loaded once per process), so the engine's start
# can compute it beside the model load (actors/startup.py) and the tokenizer core find it.
_shared: weakref.WeakKeyDictionary[TextTokenizer, tuple[TokenCountBound | None]] = (
    weakref.WeakKeyDictionary()
)


def shared_count_bound(tokenizer: TextTokenizer) -> TokenCountBound | None:
    """token_count_bound of this tokenizer's model, computed once per tokenizer object."""
    memo = _shared.get(tokenizer)
    if memo is None:
        memo = _shared[tokenizer] = (token_count_bound(tokenizer.tokenizer),)
    return memo[0]


def _num_letters(data: bytes) -> int:
    return len(data) - len(data.translate(None, _LETTERS))


def _state(component: Any) -> dict[str, Any] | None:
    """A tokenizers component as its JSON description (None stays None)."""
    if component is None:
        return None
    state: dict[str, Any] = json.loads(component.__getstate__())
    return state


def _shrink_factor(normalizer: dict[str, Any] | None) -> int | None:
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1
        for part in normalizer.get("normalizers", []):
            part_factor = _shrink_factor(part)
            if part_factor is None:
                return None
            factor *= part_factor
        return factor
    if kind == "Replace":
        pattern, content = normalizer.get("pattern", {}), normalizer.get("content", "")
        if not isinstance(pattern, dict) or "String" not in pattern or not content:
            return None  # a regex or a deletion can remove any amount of text
        return max(1, math.ceil(len(pattern["String"].encode()) / len(content.encode())))
    return _SHRINK.get(str(kind))  # Strip, StripAccents, Precompiled...: unbounded, None


def _model_bound(tokenizer: Tokenizer) -> tuple[int, bytes, dict[str, int]] | None:
    """(bytes of input the longest vocabulary token covers, bytes the model drops, the model's
    vocabulary); None if unknown words can become one token (neither a byte-level alphabet nor
    a byte fallback)."""
    model = tokenizer.model
    if not isinstance(model, models.BPE) or model.dropout:
        return None
    pre_tokenizer = _state(tokenizer.pre_tokenizer)
    if not _keeps_text(pre_tokenizer):
        return None
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    if _is_byte_level(pre_tokenizer):
        missing = {char for char in pre_tokenizers.ByteLevel.alphabet() if char not in vocab}
        uncounted = bytes(
            sorted(
                b
                for char, b in byte_level_alphabet().items()
                if char in missing and b not in _NEVER_IN_UTF8
            )
        )
        # Every character of a byte-level token stands for exactly one byte of the input.
        return max(len(token) for token in vocab), uncounted, vocab
    if model.byte_fallback and all(f"<0x{b:02X}>" in vocab for b in range(256)):
        # The model reads the normalized text's characters; a byte token covers one byte.
        return max(len(token.encode()) for token in vocab), b"", vocab
    return None


def _is_byte_level(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "ByteLevel":
        return True
    return any(_is_byte_level(p) for p in pre_tokenizer.get("pretokenizers", []))


def _keeps_text(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    if pre_tokenizer.get("type") not in _KEEPS_TEXT or pre_tokenizer.get("behavior") == "Removed":
        return False
    return all(_keeps_text(p) for p in pre_tokenizer.get("pretokenizers", []))
