"""What a request's first event carries besides its tokens: its prompt's logprobs
(SamplingParams.prompt_logprobs), its embedding (SamplingParams.pooling) and its prompt's token
ids (SamplingParams.return_prompt_token_ids, from its RequestOpened).

The runner scores each chunk of a prompt it computes (PromptLogprobs, one per chunk and step)
and pools the prompt once its last token is in (Pooled); the streamer gathers them here and
hands them out with the request's first token (each sample's, with n > 1). A prompt computed
again (preempted by recompute) is scored again: positions already held are skipped, so each
prompt position is listed once, in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import NamedTuple

import structlog
from troupe.messages import PromptLogprobs, RequestOpened, TokenBatch, TokenLogprob

log = structlog.get_logger("troupe.streamer")


@dataclasses.dataclass(slots=True)
class PromptScores:
    """Positions 1 .. len(entries) of one prompt (position 0 has no logprob)."""

    entries: list[TokenLogprob] = dataclasses.field(default_factory=list)

    @property
    def next_position(self) -> int:
        return 1 + len(self.entries)

    def add(self, chunk: PromptLogprobs) -> None:
        """Take what `chunk` adds after the positions held (none when it is a recompute's)."""
        skip = self.next_position - chunk.start
        if skip < 0:  # a gap: the runner scored a chunk past one it never sent
            log.error(
                "prompt logprobs out of order",
                request_id=chunk.request_id,
                expected=self.next_position,
                got=chunk.start,
            )
            return
        self.entries.extend(chunk.entries[skip:])


class First(NamedTuple):
    """A first event's extras (None: not asked for)."""

    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    embedding: tuple[float, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None


class FirstExtras:
    """Per open request that asked for them: prompt logprobs so far, the embedding (the prompt's
    token ids ride on its RequestOpened)."""

    def __init__(self) -> None:
        self._scores: dict[str, PromptScores] = {}
        self._embeddings: dict[str, tuple[float, ...]] = {}

    def open(self, opened: RequestOpened) -> None:
        if opened.params.prompt_logprobs is not None:
            self._scores[opened.request_id] = PromptScores()

    def add(self, batch: TokenBatch) -> None:
        """A step's scored chunks and embeddings (ahead of the first token they lead to)."""
        for chunk in batch.prompt_logprobs:
            if (scores := self._scores.get(chunk.request_id)) is not None:
                scores.add(chunk)
        for pooled in batch.embeddings:  # a recompute's again: the same vector
            self._embeddings[pooled.request_id] = pooled.embedding

    def first_event(self, opened: RequestOpened) -> First:
        """What a first event of the request `opened` (or of one of its samples) carries."""
        request_id = opened.request_id
        scores = self._scores.get(request_id)
        return First(
            None if scores is None else tuple(scores.entries),
            self._embeddings.get(request_id),
            opened.prompt_token_ids,  # its own: the samples share the RequestOpened
        )

    def forget(self, request_ids: Iterable[str]) -> None:
        """The requests ended."""
        for request_id in request_ids:
            self._scores.pop(request_id, None)
            self._embeddings.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._scores) + len(self._embeddings)
