"""An embeddings prompt (GenerateRequest.prompt_embeds) checked where requests are tokenized.

What the tokenizer core does for it in place of tokenizing:
    refuse   the engine takes none (enable_prompt_embeds off), malformed rows, a width other
             than the model's hidden size, too many rows for max_model_len, and what reads the
             prompt's token ids, which it has none of (prompt_logprobs, repetition_penalty)
    cut      truncate_prompt_tokens keeps the last k rows, as it keeps the last k tokens
    digest   a hash of the rows, the namespace its prefix-cache entries live in: requests with
             the same rows share cached blocks, other rows never do (the token ids, all
             placeholders, cannot tell them apart)
Each refusal is (code, field, message), the field the one a client sent.
"""

from __future__ import annotations

import hashlib

import msgspec
from troupe.actors.core.tokenizer_params import TruncationError, truncation_length
from troupe.messages import GenerateRequest, PromptEmbeds, RejectCode

Refusal = tuple[RejectCode, str, str]
FIELD = "prompt_embeds"
NOT_SERVED = (
    "prompt_embeds are not served by this engine: start it with enable_prompt_embeds "
    "(troupe serve --enable-prompt-embeds)"
)


def checked_embeds(
    req: GenerateRequest, *, width: int, max_model_len: int | None
) -> PromptEmbeds | Refusal:
    """The rows to run (cut, digest set), or why not. `width`: the hidden size the engine's
    runner takes (0: none)."""
    embeds = req.prompt_embeds
    assert embeds is not None, "an embeddings request"
    if width == 0:
        return RejectCode.INVALID_REQUEST, FIELD, NOT_SERVED
    if (problem := embeds.problem()) is not None:
        return RejectCode.INVALID_REQUEST, FIELD, problem
    if embeds.hidden_size != width:
        return (
            RejectCode.INVALID_REQUEST,
            FIELD,
            f"prompt_embeds rows hold {embeds.hidden_size} values; the model's hidden_size is "
            f"{width}",
        )
    params = req.params
    if params.prompt_logprobs is not None:
        return (
            RejectCode.INVALID_REQUEST,
            "prompt_logprobs",
            "prompt_logprobs cannot be given for prompt_embeds: its positions have no token "
            "ids to score",
        )
    if params.repetition_penalty != 1.0:
        return (
            RejectCode.INVALID_REQUEST,
            "repetition_penalty",
            "repetition_penalty reads the prompt's token ids, which prompt_embeds has none of: "
            "leave it at 1 (presence and frequency penalties read the output only)",
        )
    try:
        keep = truncation_length(params, max_model_len)
    except TruncationError as exc:
        return RejectCode.INVALID_REQUEST, "truncate_prompt_tokens", str(exc)
    if keep is not None and keep < embeds.num_rows:
        embeds = embeds.rows(embeds.num_rows - keep, embeds.num_rows)
    if max_model_len is not None and embeds.num_rows >= max_model_len:
        return (
            RejectCode.TOO_LONG,
            FIELD,
            f"prompt_embeds has {embeds.num_rows} rows; max_model_len is {max_model_len} (the "
            "prompt must leave room for at least one generated token)",
        )
    return msgspec.structs.replace(embeds, digest=rows_digest(embeds))


def rows_digest(embeds: PromptEmbeds) -> str:
    """A hash of the rows, their shape and dtype (what their KV depends on)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{embeds.dtype}:{embeds.num_rows}x{embeds.hidden_size}:".encode())
    h.update(embeds.data)
    return h.hexdigest()


def cache_namespace(base: str, embeds: PromptEmbeds | None) -> str:
    """The prefix-cache namespace of a request: its params' (adapter, salt), and for an
    embeddings prompt its rows' digest too. (A prompt's images key their own blocks instead:
    messages/images.cache_tokens.)"""
    if embeds is None:
        return base
    return f"{base}\x1eembeds:{embeds.digest}"
