"""Tokens a request may not sample this step: vLLM's `bad_words` and `allowed_token_ids`.

A bad word is a token-id sequence (the tokenizer actor encodes it). Its last token is banned
when the request's output so far ends with the rest of it (vLLM's v1 rule: only output
tokens count, never the prompt; a one-token word is banned always):

    word     [a b c]      output ... x a b   ->  c banned at the next draw
    word     [c]                             ->  c banned at every draw

`allowed_token_ids` is the opposite: every token outside the set is banned (-inf), so the
draw, greedy or random, picks among the set. Both are masks: raw logprobs still read the raw
logits, as for logit_bias (processed ones show the bans: EngineConfig.logprobs_mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class BadWords:
    """One request's bad words, split by whether a ban depends on the output."""

    always: np.ndarray  # int64 [K]: one-token words
    prefixes: tuple[np.ndarray, ...]  # int64 each: a longer word's tokens but the last
    lasts: np.ndarray  # int64 [W]: ... and that last token

    @property
    def reads_history(self) -> bool:
        return bool(self.prefixes)


def bad_words(words: Sequence[Sequence[int]]) -> BadWords | None:
    """The arrays of `words` (SamplingParams.bad_words_token_ids), or None without any."""
    if not words:
        return None
    longer = [w for w in words if len(w) > 1]
    return BadWords(
        always=np.array(sorted({w[0] for w in words if len(w) == 1}), np.int64),
        prefixes=tuple(np.array(w[:-1], np.int64) for w in longer),
        lasts=np.array([w[-1] for w in longer], np.int64),
    )


def banned_words(words: BadWords, output: np.ndarray) -> np.ndarray:
    """int64 ids the next draw may not take, after the request's `output` tokens (in order;
    only its tail is read: the longest prefix's length)."""
    if not words.prefixes:
        return words.always
    hits = [
        last
        for prefix, last in zip(words.prefixes, words.lasts.tolist(), strict=True)
        if len(prefix) <= len(output)
        and np.array_equal(output[len(output) - len(prefix) :], prefix)
    ]
    if not hits:
        return words.always
    return np.concatenate([words.always, np.array(hits, np.int64)])
