"""A request's prompt logprobs as its chunks come in (SamplingParams.prompt_logprobs).

The runner scores each chunk of a prompt it computes (PromptLogprobs, one per chunk and step);
the streamer gathers them here and hands the whole list out with the request's first token. A
prompt computed again (preempted by recompute) is scored again: positions already held are
skipped, so each prompt position is listed once, in order.
"""

from __future__ import annotations

import dataclasses

import structlog
from troupe.messages import PromptLogprobs, TokenLogprob

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
