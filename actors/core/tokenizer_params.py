"""What the tokenizer does for three sampling fields: `truncate_prompt_tokens` (a prompt cut to
its last k tokens), `bad_words` and `thinking_tags` (turned into token-id sequences for the
executor; the tags' with whether the prompt leaves thinking open).

Both happen where text becomes ids because nothing downstream tokenizes: the executor bans the
words by id, admission counts the prompt it is given. The tokenizer owns both facts: it writes
`SamplingParams.bad_words_token_ids` from `bad_words` (replacing whatever was there) and hands
admission only the kept prompt, so `usage.prompt_tokens` counts the tokens that ran.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.gpu.thinking_budget import thinking_since
from troupe.messages import SamplingParams, ThinkingIds


class TruncationError(ValueError):
    """truncate_prompt_tokens broke a limit (the message names it)."""


def truncation_length(params: SamplingParams, max_model_len: int | None) -> int | None:
    """How many prompt tokens to keep (the last ones), or None for all.

    vLLM's rule: k >= 1, or -1 for max_model_len; k past max_model_len is an error."""
    k = params.truncate_prompt_tokens
    if k is None:
        return None
    if k != -1 and k < 1:
        raise TruncationError(f"truncate_prompt_tokens must be an integer >= 1 or -1, got {k}")
    if k == -1:
        if max_model_len is None:
            return None
        return max_model_len
    if max_model_len is not None and k > max_model_len:
        raise TruncationError(
            f"truncate_prompt_tokens value ({k}) is greater than max_model_len "
            f"({max_model_len}). Please, select a smaller truncation size."
        )
    return k


def bad_words_token_ids(
    tokenizer: TextTokenizer, words: Sequence[str]
) -> tuple[tuple[int, ...], ...]:
    """vLLM's SamplingParams.update_from_tokenizer: each word (leading spaces stripped) encoded
    without special tokens, then with one leading space; the spaced form is kept only when it
    is another word token of the same length (a tokenizer that ignores the space gives the same
    ids: no second entry)."""
    stripped = [w.lstrip() for w in words]
    texts = [text for w in stripped for text in (w, " " + w)]
    encoded = tokenizer.encode_batch(texts, add_special_tokens=False) if texts else []
    out: list[tuple[int, ...]] = []
    for i in range(0, len(encoded), 2):
        plain, spaced = tuple(encoded[i]), tuple(encoded[i + 1])
        if not plain:  # nothing to ban (a word of characters the tokenizer drops)
            continue
        out.append(plain)
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return tuple(out)


def with_bad_words(tokenizer: TextTokenizer, params: SamplingParams) -> SamplingParams:
    """`params` with bad_words_token_ids filled from bad_words (emptied without words)."""
    ids = bad_words_token_ids(tokenizer, params.bad_words or ())
    if ids == params.bad_words_token_ids:
        return params
    return msgspec.structs.replace(params, bad_words_token_ids=ids)


def with_thinking(
    tokenizer: TextTokenizer, params: SamplingParams, prompt_ids: Sequence[int]
) -> SamplingParams:
    """`params` with thinking_ids filled from thinking_tags (None without tags): each tag
    encoded without special tokens, and `opened` where the prompt leaves thinking open (an
    opening tag after its last closing one: a template that starts the answer's thinking),
    or where the params say the answer starts thinking (thinking_from_start)."""
    tags = params.thinking_tags
    if tags is None:
        clear = params.thinking_ids is not None  # a client's own ids are never taken
        return msgspec.structs.replace(params, thinking_ids=None) if clear else params
    start, end = (tuple(ids) for ids in tokenizer.encode_batch(tags, add_special_tokens=False))
    prompt = np.asarray(prompt_ids, np.int64)
    in_prompt = thinking_since(prompt, start, end, opened=False) is not None
    ids = ThinkingIds(start=start, end=end, opened=in_prompt or params.thinking_from_start)
    return msgspec.structs.replace(params, thinking_ids=ids)
