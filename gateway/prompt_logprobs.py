"""The prompt's logprobs over HTTP, as vLLM serves them: its `prompt_logprobs` extra field, and
completions' echo (the prompt leading each choice's text and, with logprobs, its logprobs).

    prompt_logprobs   [null, {"<token id>": {"logprob", "rank", "decoded_token"}, ...}, ...]
                      one entry per prompt token, the first null (nothing comes before it);
                      each holds the prompt's token, then the top-k alternatives (rank 1..k).
                      The prompt token's rank is the engine's (its place among all tokens,
                      ties counted, as vLLM's); where an engine gives none (the fake runner),
                      its place among the top k, or null outside them.
                      Completions: on each choice; chat: on the response. Not streamed.
    echo + logprobs   the prompt's tokens lead choices[i].logprobs (gateway/completion_logprobs)
                      and, streamed, a choice's first chunk carries the prompt's text and rows.
    echo, max_tokens 0
                      the prompt alone: the engine runs one token, which is not shown (vLLM's
                      way; usage counts it, as vLLM's does).

The engine sends the entries on a request's first event for each sample (Delta or Finished);
they start at the prompt's second token, so echo learns the first from the prompt itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from troupe.gateway.completion_logprobs import LOGPROB_FLOOR, LogprobRow, TokenTexts, prompt_rows
from troupe.gateway.engine_api import TokenizerLike
from troupe.messages import Delta, Finished, TokenLogprob

PromptLogprobs = tuple[TokenLogprob, ...]


def prompt_logprobs_json(
    entries: Sequence[TokenLogprob] | None, text: TokenTexts
) -> list[dict[int, dict[str, Any]] | None] | None:
    """vLLM's `prompt_logprobs` list (None: the engine sent none)."""
    if entries is None:
        return None
    out: list[dict[int, dict[str, Any]] | None] = [None]
    for entry in entries:
        ranked = {token_id: i + 1 for i, (token_id, _) in enumerate(entry.top)}
        rank = entry.rank if entry.rank is not None else ranked.get(entry.token_id)
        position = {entry.token_id: _logprob(entry.logprob, rank, entry.token_id, text)}
        for token_id, logprob in entry.top:
            position[token_id] = _logprob(logprob, ranked[token_id], token_id, text)
        out.append(position)
    return out


def _logprob(logprob: float, rank: int | None, token_id: int, text: TokenTexts) -> dict[str, Any]:
    return {"logprob": max(logprob, LOGPROB_FLOOR), "rank": rank, "decoded_token": text(token_id)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Echo:
    """completions' echo for one request: each prompt's text leads its n choices (chat's:
    `of_chat`)."""

    texts: list[str]  # per prompt
    n: int  # choices per prompt
    num_top: int | None  # logprobs (None: none asked for)
    first_token_ids: list[int | None]  # per prompt, with logprobs (None: not known)
    is_prompt_only: bool  # max_tokens 0: the prompt alone, no generated text

    @classmethod
    def of_chat(cls, text: str, n: int) -> Echo:
        """Chat's echo (vLLM's): one text leads every choice's content; no logprobs."""
        return cls(texts=[text], n=n, num_top=None, first_token_ids=[None], is_prompt_only=False)

    @property
    def has_logprobs(self) -> bool:
        return self.num_top is not None

    def text(self, index: int) -> str:
        return self.texts[index // self.n]

    def rows(
        self, index: int, entries: PromptLogprobs | None, text: TokenTexts
    ) -> list[LogprobRow]:
        """Choice `index`'s prompt rows, from the entries on its first event."""
        if self.num_top is None:
            return []
        first = self.first_token_ids[index // self.n]
        return prompt_rows(first, entries, self.num_top, text)


async def echo_for(
    tokenizer: TokenizerLike,
    prompts: Sequence[str | list[int]],
    *,
    n: int,
    num_top: int | None,
    is_prompt_only: bool,
) -> Echo:
    """The echo of a request's prompts: a text prompt as sent, token ids decoded (special
    tokens kept); with logprobs, each prompt's first token (a text is encoded as the engine
    encodes it). Off the event loop: prompts run long."""
    texts, first_ids = [], []
    for prompt in prompts:
        if isinstance(prompt, str):
            texts.append(prompt)
            if num_top is not None:
                ids = await asyncio.to_thread(tokenizer.encode, prompt, True)
                first_ids.append(int(ids[0]) if len(ids) else None)
        # ids outside the vocabulary are not decoded: the engine rejects the prompt, naming it
        elif all(0 <= t < tokenizer.vocab_size for t in prompt):
            texts.append(await asyncio.to_thread(tokenizer.decode, prompt, False))
            first_ids.append(prompt[0] if prompt else None)
        else:
            texts.append("")
            first_ids.append(None)
    return Echo(
        texts=texts, n=n, num_top=num_top, first_token_ids=first_ids, is_prompt_only=is_prompt_only
    )


class PromptLogprobsSeen:
    """One request's prompt logprobs, per choice, as their first events bring them; and where
    a whole answer shows them."""

    def __init__(
        self, kind: str, prompt_logprobs: int | None, echo: Echo | None, text: TokenTexts
    ) -> None:
        self._kind = kind
        # shown whenever the engine scores the prompt (SamplingParams.prompt_logprobs), as
        # vLLM shows them: echo with logprobs included
        self._is_shown = prompt_logprobs is not None
        self._echo = echo
        self._text = text
        self._entries: dict[int, PromptLogprobs] = {}

    def see(self, event: Delta | Finished) -> None:
        if event.prompt_logprobs is not None:
            self._entries[event.index] = event.prompt_logprobs

    def lead(self, index: int) -> list[LogprobRow]:
        """Echo with logprobs: choice `index`'s prompt rows."""
        if self._echo is None:
            return []
        return self._echo.rows(index, self._entries.get(index), self._text)

    def add_to_choice(self, choice: dict[str, Any], index: int) -> None:
        """Completions: each choice carries its prompt's."""
        if self._is_shown and self._kind == "completion":
            choice["prompt_logprobs"] = prompt_logprobs_json(self._entries.get(index), self._text)

    def add_to_response(self, body: dict[str, Any]) -> dict[str, Any]:
        """Chat: the response carries them (one prompt)."""
        if self._is_shown and self._kind == "chat":
            body["prompt_logprobs"] = prompt_logprobs_json(self._entries.get(0), self._text)
        return body
