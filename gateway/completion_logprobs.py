"""Completions' legacy logprobs object, as vLLM serves it (entrypoints/openai/serving_completion
`_create_completion_logprobs`):

    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [...], "text_offset": [...]}

one row per token. With echo the prompt's tokens lead the generated ones; the prompt's first
token has no logprob (null in token_logprobs and top_logprobs). A top_logprobs entry maps token
text -> logprob: the chosen token first, then the top alternatives, `num_top` + 1 entries at most
(k when the chosen token is among the top k, k + 1 when it is not). text_offset runs on over the
tokens' texts (the prompt's first), across a stream's chunks.

vLLM's `return_tokens_as_token_ids` (the request's field, else the server's flag): each token
and top_logprobs key is named "token_id:{id}" instead of its text (a token that is part of a
UTF-8 character decodes to no text of its own); text_offset still counts the tokens' texts,
which is what the choice's text is made of.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from troupe.gateway.engine_api import TokenizerLike
from troupe.messages import TokenLogprob

# JSON has no -inf: OpenAI and vLLM send this floor instead
LOGPROB_FLOOR = -9999.0


def token_id_label(token_id: int) -> str:
    """vLLM's name for a token under return_tokens_as_token_ids."""
    return f"token_id:{token_id}"


class TokenTexts:
    """One token's text, decoded alone and remembered (a prompt's rows repeat tokens); and
    the name logprobs give it (`label`: its text, or "token_id:{id}" with `as_token_ids`)."""

    def __init__(
        self,
        tokenizer: TokenizerLike | None,
        *,
        skip_special_tokens: bool,
        as_token_ids: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._memo: dict[int, str] = {}
        self.as_token_ids = as_token_ids

    def label(self, token_id: int) -> str:
        """The token as logprobs name it."""
        return token_id_label(token_id) if self.as_token_ids else self(token_id)

    def __call__(self, token_id: int) -> str:
        text = self._memo.get(token_id)
        if text is None:
            tokenizer = self._tokenizer
            text = "" if tokenizer is None else tokenizer.decode([token_id], self._skip)
            self._memo[token_id] = text
        return text


class LogprobRow(NamedTuple):
    """One token of a completions logprobs object."""

    token: str  # as logprobs name it (TokenTexts.label)
    logprob: float | None  # None: the prompt's first token
    top: dict[str, float] | None
    num_chars: int  # its text's length in the choice's text (text_offset counts these)


def top_entry(entry: TokenLogprob, num_top: int | None, text: TokenTexts) -> dict[str, float]:
    """vLLM's top_logprobs entry: the chosen token, then the top alternatives (by id, the
    chosen one once), the first num_top + 1 of them (None: all); keyed by label."""
    by_id = {entry.token_id: entry.logprob}
    for token_id, logprob in entry.top:
        by_id[token_id] = logprob
    limit = len(by_id) if num_top is None else num_top + 1
    return {
        text.label(token_id): max(logprob, LOGPROB_FLOOR)
        for token_id, logprob in itertools.islice(by_id.items(), limit)
    }


def rows(
    entries: Iterable[TokenLogprob], num_top: int | None, text: TokenTexts
) -> list[LogprobRow]:
    """Rows of tokens that have logprobs (generated tokens, prompt positions 1..); num_top:
    cut each top entry to the chosen token + num_top (a prompt scored with more than the
    request's logprobs)."""
    return [
        LogprobRow(
            text.label(e.token_id),
            max(e.logprob, LOGPROB_FLOOR),
            top_entry(e, num_top, text),
            len(text(e.token_id)),
        )
        for e in entries
    ]


def prompt_rows(
    first_token_id: int | None,
    entries: Sequence[TokenLogprob] | None,
    num_top: int,
    text: TokenTexts,
) -> list[LogprobRow]:
    """Echo: the prompt's rows, its first token (no logprob) then each position's (the
    engine's SamplingParams.prompt_logprobs entries). None: the prompt's are unknown."""
    if entries is None or first_token_id is None:
        return []
    first = LogprobRow(text.label(first_token_id), None, None, len(text(first_token_id)))
    return [first, *rows(entries, num_top, text)]


def logprobs_object(lead: Sequence[LogprobRow], offset: int) -> tuple[dict[str, Any], int]:
    """The logprobs object of `lead`'s rows, its offsets starting at `offset`; and the offset
    after its last token (where the next chunk's start)."""
    offsets = []
    for row in lead:
        offsets.append(offset)
        offset += row.num_chars
    body = {
        "tokens": [row.token for row in lead],
        "token_logprobs": [row.logprob for row in lead],
        "top_logprobs": [row.top for row in lead],
        "text_offset": offsets,
    }
    return body, offset
