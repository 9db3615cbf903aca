"""Inbox of the Streamer: requests opening, rejections, and one TokenBatch per step."""

from __future__ import annotations

import msgspec
from troupe.messages.common import FinishReason, RejectCode, TokenLogprob
from troupe.messages.events import EngineStats, FailureCause
from troupe.messages.pooling import Pooled
from troupe.messages.sampling import SamplingParams
from troupe.messages.scheduler import PromptLogprobs


class RequestOpened(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """From the Tokenizer, before the request goes on to Admission (so it always arrives
    ahead of the request's tokens)."""

    request_id: str
    params: SamplingParams
    num_prompt_tokens: int
    prompt_tail_ids: tuple[int, ...]  # last few prompt tokens: context for detokenization
    arrival_time: float
    prompt_token_ids: tuple[int, ...] | None = None  # SamplingParams.return_prompt_token_ids


class RequestRejected(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """From the Tokenizer or Admission: the request never runs."""

    request_id: str
    code: RejectCode
    message: str
    field: str | None = None


class RequestFailed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """From the Tokenizer or Admission: handling this request raised (an engine fault, not the
    client's); it never runs and ends with a Failed event. Other requests are unaffected."""

    request_id: str
    message: str


# array_like + gc=False: one per sequence per step on the hot path.
class SeqOutput(msgspec.Struct, frozen=True, array_like=True, gc=False):
    request_id: str
    token_ids: tuple[int, ...]  # newly sampled tokens (usually one; empty on abort/error)
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None  # the stop token id (EOS or stop_token_ids) that matched
    logprobs: tuple[TokenLogprob, ...] | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None
    cause: FailureCause = FailureCause.INTERNAL  # of an error: Failed.cause


class FirstScheduled(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Requests the scheduler put in a step for the first time, and when: the latest time it
    had seen in a message when it planned that step (it reads no clock, so a replay gives the
    same). A parallel-sampling parent is named by the request's id."""

    time: float
    request_ids: tuple[str, ...]


class TokenBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """From the Scheduler, one per step (or for aborts/failures outside a step)."""

    step_id: int
    time: float  # the step's StepResult time
    outputs: tuple[SeqOutput, ...]
    stats: EngineStats | None = None
    prompt_logprobs: tuple[PromptLogprobs, ...] = ()  # the step's scored prompt chunks
    embeddings: tuple[Pooled, ...] = ()  # the prompts the step finished pooling
    # Requests first scheduled since the last TokenBatch (so never after their terminal output)
    first_scheduled: FirstScheduled | None = None


StreamerInbox = RequestOpened | RequestRejected | RequestFailed | TokenBatch
