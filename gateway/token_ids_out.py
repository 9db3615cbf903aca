"""vLLM's `return_token_ids` on completions and chat: token ids beside the text.

    whole answer  choices[i].token_ids: the ids of the answer's text (what a stop string cut
                  is cut from both); completions: choices[i].prompt_token_ids, the prompt that
                  choice ran; chat: the response's prompt_token_ids (one prompt for all)
    stream        every chunk of a choice carries token_ids, the ids its delta holds (a token
                  whose text is not complete yet comes with an empty delta); the prompt's ids
                  lead a completion choice's first chunk, and chat's first chunk (the role's)

The engine puts the prompt's ids on each sample's first event (SamplingParams.
return_prompt_token_ids): the ids it ran, after the chat template and truncate_prompt_tokens.
An embeddings prompt has none: null.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from troupe.messages import Delta, Finished


class TokenIds:
    """One request's ids, gathered from its events for a whole answer."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._outputs: dict[int, list[int]] = defaultdict(list)
        self._prompts: dict[int, list[int]] = {}  # from each choice's first event

    def see(self, event: Delta | Finished) -> None:
        self._outputs[event.index].extend(event.token_ids)
        if event.prompt_token_ids is not None:
            self._prompts[event.index] = list(event.prompt_token_ids)

    def add_to_choice(self, choice: dict[str, Any], index: int) -> None:
        choice["token_ids"] = self._outputs[index]
        if self._kind == "completion":
            choice["prompt_token_ids"] = self._prompts.get(index)

    def add_to_response(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._kind == "chat":  # the samples share the prompt
            body["prompt_token_ids"] = next(iter(self._prompts.values()), None)
        return body


def chunk_with_ids(chunk: dict[str, Any], event: Delta | Finished, kind: str) -> dict[str, Any]:
    """A stream chunk of one choice (`event`'s) with its ids."""
    choice = chunk["choices"][0]
    choice["token_ids"] = event.token_ids  # tuples encode as JSON arrays
    if kind == "completion" and event.prompt_token_ids is not None:
        choice["prompt_token_ids"] = event.prompt_token_ids
    return chunk
