"""What troupe.LLM returns, in vLLM's shapes (RequestOutput, CompletionOutput), and how one
engine event adds to them."""

from __future__ import annotations

from dataclasses import dataclass, field

from troupe.messages import Aborted, Delta, Finished, TokenLogprob


@dataclass
class CompletionOutput:
    """One sample of a prompt (vLLM's CompletionOutput)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[TokenLogprob] | None = None  # SamplingParams.logprobs: each token's row
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: str | int | None = None  # the stop string or token id that matched


@dataclass
class RequestOutput:
    """One prompt's request, all its samples done (vLLM's RequestOutput)."""

    request_id: str
    prompt: str | None  # the text, when the prompt was text
    prompt_token_ids: list[int] | None
    outputs: list[CompletionOutput]
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None  # positions 1.. of the prompt
    num_cached_tokens: int = 0
    embedding: tuple[float, ...] | None = None  # SamplingParams.pooling
    finished: bool = True


@dataclass
class PoolingRequestOutput:
    """One prompt's pooled vector (vLLM's EmbeddingRequestOutput / ClassificationRequestOutput:
    `embedding`, or the class probabilities for classify)."""

    request_id: str
    prompt_token_ids: list[int] | None
    embedding: list[float]


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """One pair's score (vLLM's ScoringRequestOutput: `outputs.score`); prompt_token_ids: a
    cross-encoder's pair prompt, or an embedding model's two texts' ids one after the other."""

    request_id: str
    prompt_token_ids: list[int] | None
    score: float
    finished: bool = True

    @property
    def outputs(self) -> ScoringOutput:
        return ScoringOutput(self.score)


def take_event(out: RequestOutput, event: Delta | Finished | Aborted) -> None:
    """Add one event of sample `event.index` to `out`."""
    sample = out.outputs[event.index]
    sample.text += event.text
    sample.token_ids.extend(event.token_ids)
    if isinstance(event, Delta | Finished):
        if event.prompt_token_ids is not None:
            out.prompt_token_ids = list(event.prompt_token_ids)
        if event.prompt_logprobs is not None:
            out.prompt_logprobs = event.prompt_logprobs
        if event.embedding is not None:
            out.embedding = event.embedding
        if event.logprobs is not None:
            sample.logprobs = (sample.logprobs or []) + list(event.logprobs)
    if isinstance(event, Finished | Aborted):
        sample.finish_reason = str(event.finish_reason)
        out.num_cached_tokens = max(out.num_cached_tokens, event.usage.cached_tokens)
    if isinstance(event, Finished):
        sample.stop_reason = event.stop_reason
        sample.cumulative_logprob = event.cumulative_logprob
        if sample.cumulative_logprob is None and sample.logprobs is not None:
            sample.cumulative_logprob = sum(row.logprob for row in sample.logprobs)
