"""Inbox of the Scheduler: admitted requests, aborts, stop-string hits, allocation results and
step results.

The scheduler sits on the graph's cycles (executor, allocator, streamer and admission all feed
it), so its inbox is the one unbounded channel; admission bounds how much can be in flight.
"""

from __future__ import annotations

import enum

import msgspec
from troupe.messages.common import TokenLogprob
from troupe.messages.engine_calls import (
    CacheDropped,
    ResetPrefixCache,
    UpdateWeights,
    WeightsLoaded,
)
from troupe.messages.images import PromptImage
from troupe.messages.pooling import Pooled
from troupe.messages.profile_calls import ProfileReply, StartProfile, StopProfile
from troupe.messages.prompt_embeds import PromptEmbeds
from troupe.messages.sampling import SamplingParams
from troupe.messages.sleep_calls import Sleep, SleepDone, WakeUp
from troupe.messages.tokenizer import AbortRequest


class AdmittedRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_time: float
    max_total_tokens: int  # prompt + max_tokens, capped by max_model_len
    # an embeddings prompt's rows, kept by the scheduler for every (re)computation of them
    prompt_embeds: PromptEmbeds | None = None
    images: tuple[PromptImage, ...] = ()  # kept too: a recomputation encodes them again


class StopRequests(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """From the Streamer: these requests matched a stop string; finish them now."""

    request_ids: tuple[str, ...]


class Grant(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Blocks given to one request, in transit to the executor: a Grow's added blocks, or the
    whole table after AllocateNew/SwapIn. The scheduler keeps only their number."""

    request_id: str
    block_ids: tuple[int, ...]
    num_cached_tokens: int = 0  # AllocateNew: prompt tokens found in the prefix cache


class RefusalReason(enum.StrEnum):
    """Why the allocator refused one op; what it did instead."""

    NO_GPU_BLOCKS = "no_gpu_blocks"  # Grow/SwapIn/AllocateNew did not fit: nothing changed
    NO_CPU_BLOCKS = "no_cpu_blocks"  # SwapOut without CPU room: the request was freed instead


class Refusal(msgspec.Struct, frozen=True, array_like=True, gc=False):
    request_id: str
    reason: RefusalReason


class AllocationResult(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """The allocator's answer to one AllocateBatch, with the counts the scheduler plans with.

    `shared` lists, for each request whose number changed in this batch, how many of its GPU
    blocks other requests hold too (prefix-cache sharing): releasing a request frees at least
    its blocks minus that number.
    """

    step_id: int
    grants: tuple[Grant, ...] = ()  # in op order (Fork, Grow, SwapIn, AllocateNew)
    refused: tuple[Refusal, ...] = ()  # in op order
    shared: tuple[tuple[str, int], ...] = ()  # (request id, GPU blocks it shares), changed ones
    swap_out: tuple[tuple[int, int], ...] = ()  # (gpu block, cpu block) copies
    swap_in: tuple[tuple[int, int], ...] = ()  # (cpu block, gpu block) copies
    copy_blocks: tuple[tuple[int, int], ...] = ()  # (src, dst) GPU copies: Fork's partial block
    num_gpu_free: int = 0  # not owned by any request (includes cached)
    num_gpu_cached: int = 0  # free but holding reusable prefix KV (evictable)
    num_cpu_free: int = 0
    prefix_cache_hit_tokens: int = 0  # cumulative since start
    prefix_cache_query_tokens: int = 0  # cumulative since start
    prefix_cache_cpu_hit_tokens: int = 0  # of the hits, those served by the CPU tier
    cache_dropped: CacheDropped | None = None  # the batch's DropCachedBlocks, if it had one


class SampledToken(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A sequence's token of the step. After a verified proposal, `more` holds the tokens
    after `token_id`: token_id and all of `more` but the last are accepted proposals, the last
    is the target's own (len(more) proposals were accepted). `proposals`: a draft model's
    tokens after the last of these, for the scheduler to have verified next step."""

    request_id: str
    token_id: int
    logprob: TokenLogprob | None = None
    more: tuple[int, ...] = ()
    more_logprobs: tuple[TokenLogprob | None, ...] = ()
    proposals: tuple[int, ...] = ()


class PromptLogprobs(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A chunk's prompt logprobs (SamplingParams.prompt_logprobs): `entries[i]` is the logprob
    of the prompt token at position `start + i` given those before it (start >= 1)."""

    request_id: str
    start: int
    entries: tuple[TokenLogprob, ...]


class SeqFailureReason(enum.StrEnum):
    """Why the executor gave one sequence no token; the value is the text clients see."""

    NON_FINITE_LOGITS = "non-finite logits"  # NaN or inf in the sequence's row of logits
    GRAMMAR = "structured output failed"  # its grammar refused a token or would not compile
    # its grammar allows no token here (the client's grammar: FailureCause.GRAMMAR_DEAD_END)
    GRAMMAR_DEAD_END = "its grammar cannot be continued after the text so far"


class FailedSeq(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A sequence of the step that was computed but could not be sampled."""

    request_id: str
    reason: SeqFailureReason
    detail: str | None = None  # GRAMMAR_DEAD_END: what the grammar wants next; old traces lack it


class StepResult(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """One per StepPlan, in plan order: a token for each SeqWork with sample=True, except the
    sequences in `failed` (the scheduler fails those requests alone; the others go on).

    `error` set means the step failed: no tokens, and the scheduler fails that step's requests.

    `late` (prefill/decode disaggregation only; one executor never sets it): sampled SeqWorks
    whose token comes in a later LateTokens, not here. Their chunks were computed on the
    prefill side while the decode side answered; the scheduler counts them computed and holds
    them (Status.AWAITING: neither planned nor a preemption victim) until their token lands.
    """

    step_id: int
    time: float  # executor monotonic clock when the step finished
    sampled: tuple[SampledToken, ...] = ()
    failed: tuple[FailedSeq, ...] = ()  # in plan order; a default, so older traces still decode
    error: str | None = None
    late: tuple[str, ...] = ()  # in plan order; a default, so older traces still decode
    prompt_logprobs: tuple[PromptLogprobs, ...] = ()  # the step's scored prompt chunks
    embeddings: tuple[Pooled, ...] = ()  # the prompts the step finished pooling


class LateTokens(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """The tokens of the requests a StepResult named `late`: step `step_id`'s prefill share,
    answered after that step's result went out. The phase router sends it just before the next
    StepResult it sends, or alone at once when no step is in flight (so a scheduler with only
    awaiting requests is never left idle). It may reach the scheduler in any phase.

    Each of `request_ids` gets its token in `sampled`, or fails alone (`failed`), or, with
    `error` set, they all fail. Requests ended meanwhile (aborted, stopped) are skipped: their
    blocks were freed at once, which is safe because each side runs its shares in step order.
    """

    step_id: int
    time: float  # executor monotonic clock when the prefill share finished
    request_ids: tuple[str, ...]  # the StepResult's `late`
    sampled: tuple[SampledToken, ...] = ()
    failed: tuple[FailedSeq, ...] = ()
    error: str | None = None


SchedulerInbox = (
    AdmittedRequest
    | AbortRequest
    | StopRequests
    | AllocationResult
    | StepResult
    | LateTokens
    | ResetPrefixCache  # the engine's calls (messages/engine_calls.py)
    | UpdateWeights
    | WeightsLoaded
    | Sleep  # sleep mode (messages/sleep_calls.py)
    | WakeUp
    | SleepDone
    | StartProfile  # the profiler (messages/profile_calls.py), passed on to the executor
    | StopProfile
    | ProfileReply  # ... and its answer, to the engine
)
