"""Encode a long text chunk by chunk, token-identical to encoding it whole, stopping at a limit.

A text that passes the cheap bound (tokenizer_bound.py) can still hold far more tokens than
max_model_len: the bound allows up to 81 bytes per SmolLM2 token, ~660 KB at 8192 tokens, and
ordinary prose is ~4 bytes per token. Encoding such a text in chunks lets the encoder stop once
the count reaches the limit, so no request costs much more than `limit` tokens of work, and the
encodings held at once (~100 bytes per token on the Rust side) stay that small.

Where a cut is safe:

    ... w o r d ␠ n e x t ...
              │ └─ text[p]: a space
              └─── text[p - 1]: an ASCII letter; the cut goes between them

For the pre-tokenizers allowed here (GPT-2's byte-level regex, the Llama 3 and Qwen2 split
regexes, digit splitting) no pre-token holds a letter followed by a space, so p is always a
pre-token boundary; the regexes look ahead, never behind, so what they match from p on depends
on text[p:] only; and BPE merges never cross a pre-token boundary. NFC leaves the cut alone
(an ASCII space composes with nothing). Added tokens are matched before all of this, so a cut
must not fall near one. A tokenizer outside this allowlist is encoded whole.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tokenizers import Encoding, Tokenizer, models
from troupe.actors.core.tokenizer_gguf_pre import LLAMA3_REGEX, QWEN2_REGEX

CHUNK_CHARS = 16_384  # ~4,000 tokens of prose: ~10 ms of encoding between limit checks
_CUT = re.compile(r"[A-Za-z](?= )")
_SPLIT_REGEXES = (LLAMA3_REGEX, QWEN2_REGEX)  # split regexes the argument above holds for


@dataclass(frozen=True)
class LimitReached:
    """Encoding stopped: the text has at least `num_tokens` tokens (not counting specials)."""

    num_tokens: int


class ChunkedEncoder:
    """`encode(text)` in chunks of about `chunk_chars` characters where that is exact."""

    def __init__(self, tokenizer: Tokenizer, *, chunk_chars: int = CHUNK_CHARS) -> None:
        self._tokenizer = tokenizer
        self._chunk_chars = chunk_chars
        added = tokenizer.get_added_tokens_decoder().values()
        self._added = tuple({token.content for token in added})
        self._max_added = max((len(text) for text in self._added), default=0)
        self.is_chunkable = _is_chunkable(tokenizer)

    def encode(
        self, text: str, *, add_special_tokens: bool, limit: int | None = None
    ) -> list[int] | LimitReached:
        """The ids of `text`, or LimitReached once `limit` tokens are counted."""
        cuts = self._cuts(text) if self.is_chunkable else iter(())
        encodings: list[Encoding] = []
        num_tokens, start = 0, 0
        for cut in itertools.chain(cuts, [len(text)]):
            # encode_batch releases the GIL while Rust works; encode holds it and would stall
            # the event loop for every chunk.
            (encoding,) = self._tokenizer.encode_batch([text[start:cut]], add_special_tokens=False)
            encodings.append(encoding)
            num_tokens += len(encoding.ids)
            if limit is not None and num_tokens >= limit:
                return LimitReached(num_tokens)
            start = cut
        merged = encodings[0] if len(encodings) == 1 else Encoding.merge(encodings, True)
        final = self._tokenizer.post_process(merged, add_special_tokens=add_special_tokens)
        return list(final.ids)

    def _cuts(self, text: str) -> Iterator[int]:
        """Safe cut positions, each at least `chunk_chars` after the previous one."""
        position = self._chunk_chars
        while position < len(text):
            match = _CUT.search(text, position - 1)
            if match is None:
                return  # no safe cut left: the rest is one chunk
            cut = match.end()
            if self._is_near_added_token(text, cut):
                position = cut + 1
                continue
            yield cut
            position = cut + self._chunk_chars

    def _is_near_added_token(self, text: str, cut: int) -> bool:
        # An added token overlapping text[cut - 1 : cut + 1] lies inside this window.
        window = text[max(0, cut - self._max_added) : cut + self._max_added]
        return any(token in window for token in self._added)


def _is_chunkable(tokenizer: Tokenizer) -> bool:
    model = tokenizer.model
    if not isinstance(model, models.BPE) or model.dropout:
        return False
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return False
    normalizer = _state(tokenizer.normalizer)
    if normalizer is not None:
        if normalizer.get("type") != "NFC":
            return False
        # Normalized added tokens match the normalized text, which the window check never sees.
        if any(t.normalized for t in tokenizer.get_added_tokens_decoder().values()):
            return False
    parts = _flatten(_state(tokenizer.pre_tokenizer))
    if not parts or not all(_is_local(p) for p in parts):
        return False
    return any(_splits_at_letter_space(p) for p in parts)


def _state(component: Any) -> dict[str, Any] | None:
    if component is None:
        return None
    state: dict[str, Any] = json.loads(component.__getstate__())
    return state


def _flatten(pre_tokenizer: dict[str, Any] | None) -> list[dict[str, Any]]:
    if pre_tokenizer is None:
        return []
    if pre_tokenizer.get("type") == "Sequence":
        return [p for part in pre_tokenizer["pretokenizers"] for p in _flatten(part)]
    return [pre_tokenizer]


def _is_local(part: dict[str, Any]) -> bool:
    """Splits the same whether the text starts at the cut or before it."""
    kind = part.get("type")
    if kind == "Digits":
        return True
    if kind == "ByteLevel":
        return not part.get("add_prefix_space", False)  # a prefix space would go on each chunk
    return _splits_at_letter_space(part)


def _splits_at_letter_space(part: dict[str, Any]) -> bool:
    kind = part.get("type")
    if kind == "ByteLevel":
        return bool(part.get("use_regex", True))  # GPT-2's regex
    if kind == "Split":
        pattern = part.get("pattern", {})
        return (
            isinstance(pattern, dict)
            and pattern.get("Regex") in _SPLIT_REGEXES
            and part.get("behavior") == "Isolated"
            and not part.get("invert", False)
        )
    return False
