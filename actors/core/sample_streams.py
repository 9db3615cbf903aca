"""The streamer's side of parallel sampling: one family per request of k > 1 samples.

Each sample is its own stream in the streamer (detokenizer, stop strings, counts), keyed by its
sequence id (messages/samples.py), its events tagged with its `index` under the request's id.
The family counts the samples still open and stamps each sample's end with `samples_left`, so
the request's stream closes at its last sample's end.

With best_of > n nothing streams: the family keeps each sample's text, tokens and the sum of
its sampled tokens' logprobs, and when the last sample ends sends the n best as whole events
(finished samples first, then by cumulative logprob, highest first), indexed 0..n-1 in that
order, each with the prompt logprobs and embedding its first event carried. Logprobs the
client did not ask for (the ranking's) are dropped.
"""

from __future__ import annotations

import dataclasses

import msgspec
from troupe.messages import Aborted, Delta, Failed, Finished, StreamEvent, TokenLogprob

EndEvent = Finished | Aborted | Failed


@dataclasses.dataclass(slots=True)
class _Kept:
    """A best_of sample's output so far."""

    texts: list[str] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)
    cumulative: float = 0.0
    end: EndEvent | None = None
    # its first event's prompt logprobs and embedding (the same for every sample)
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    embedding: tuple[float, ...] | None = None


class SampleFamily:
    """The open samples of one request (by sequence id), and best_of's kept outputs."""

    def __init__(self, sample_ids: list[str], n: int, *, ranks: bool, keeps_logprobs: bool):
        self.open = dict.fromkeys(sample_ids)
        self.n = n
        self.ranks = ranks
        self.keeps_logprobs = keeps_logprobs
        self._kept = [_Kept() for _ in sample_ids] if ranks else []

    def on_event(self, sample: str, index: int, event: Delta | EndEvent) -> list[StreamEvent]:
        """What the client gets for one event of sample `index`."""
        is_end = not isinstance(event, Delta)
        if is_end:
            del self.open[sample]
        if not self.ranks:
            if isinstance(event, Delta):
                return [event]
            return [msgspec.structs.replace(event, samples_left=len(self.open))]
        kept = self._kept[index]
        kept.texts.append(event.text)
        kept.token_ids.extend(event.token_ids)
        logprobs = event.logprobs if isinstance(event, Delta | Finished) else None
        if isinstance(event, Delta | Finished) and kept.prompt_logprobs is None:
            kept.prompt_logprobs, kept.embedding = event.prompt_logprobs, event.embedding
        for lp in logprobs or ():
            kept.logprobs.append(lp)
            kept.cumulative += lp.logprob
        if isinstance(event, Delta):
            return []
        kept.end = event
        return [] if self.open else self._best()

    def _best(self) -> list[StreamEvent]:
        ranked = sorted(self._kept, key=lambda k: (not isinstance(k.end, Finished), -k.cumulative))[
            : self.n
        ]
        out: list[StreamEvent] = []
        for rank, kept in enumerate(ranked):
            end = kept.end
            assert end is not None
            common = {
                "text": "".join(kept.texts),
                "token_ids": tuple(kept.token_ids),
                "index": rank,
                "samples_left": self.n - 1 - rank,
            }
            if isinstance(end, Finished):
                logprobs = tuple(kept.logprobs) if self.keeps_logprobs else None
                out.append(
                    msgspec.structs.replace(
                        end,
                        **common,
                        logprobs=logprobs,
                        cumulative_logprob=kept.cumulative,
                        prompt_logprobs=kept.prompt_logprobs,
                        embedding=kept.embedding,
                    )
                )
            else:
                out.append(msgspec.structs.replace(end, **common))
        return out
