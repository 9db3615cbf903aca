"""Inbox of the Scheduler: admitted requests, aborts, stop-string hits, allocation results and
step results.

The scheduler sits on the graph's cycles (executor, allocator, streamer and admission all feed
it), so its inbox is the one unbounded channel; admission bounds how much can be in flight.
"""

from __future__ import annotations

import msgspec
from troupe.messages.common import TokenLogprob
from troupe.messages.sampling import SamplingParams
from troupe.messages.tokenizer import AbortRequest


class AdmittedRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_time: float
    max_total_tokens: int  # prompt + max_tokens, capped by max_model_len


class StopRequests(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """From the Streamer: these requests matched a stop string; finish them now."""

    request_ids: tuple[str, ...]


class Grant(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Blocks given to one request: appended to its table (AllocateNew/SwapIn: the whole table)."""

    request_id: str
    block_ids: tuple[int, ...]
    num_cached_tokens: int = 0  # AllocateNew: prompt tokens found in the prefix cache


class AllocationResult(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """The allocator's answer to one AllocateBatch, with the pools' counts after it."""

    step_id: int
    grants: tuple[Grant, ...] = ()  # in op order (SwapIn, Grow, AllocateNew)
    denied: tuple[str, ...] = ()  # requests whose SwapIn/Grow/AllocateNew did not fit: unchanged
    swap_failed: tuple[str, ...] = ()  # SwapOut without CPU room: freed instead (recompute)
    swap_out: tuple[tuple[int, int], ...] = ()  # (gpu block, cpu block) copies
    swap_in: tuple[tuple[int, int], ...] = ()  # (cpu block, gpu block) copies
    num_gpu_free: int = 0  # not owned by any request (includes cached)
    num_gpu_cached: int = 0  # free but holding reusable prefix KV (evictable)
    num_cpu_free: int = 0
    prefix_cache_hit_tokens: int = 0  # cumulative since start
    prefix_cache_query_tokens: int = 0  # cumulative since start


class SampledToken(msgspec.Struct, frozen=True, array_like=True, gc=False):
    request_id: str
    token_id: int
    logprob: TokenLogprob | None = None


class StepResult(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """One per StepPlan, in plan order: a token for each SeqWork with sample=True.

    `error` set means the step failed: no tokens, and the scheduler fails that step's requests.
    """

    step_id: int
    time: float  # executor monotonic clock when the step finished
    sampled: tuple[SampledToken, ...] = ()
    error: str | None = None


SchedulerInbox = AdmittedRequest | AbortRequest | StopRequests | AllocationResult | StepResult
