"""Blocks a running request lets go of behind its window, and what of it the prefix cache may
keep: a model's sliding window (every layer's), or a StreamingLLM request's sinks + window.

StreamingLLM (SamplingParams.streaming_window W, sink_tokens S), block_size 4, S = 2, W = 6:

    positions   0 1 2 3 | 4 5 6 7 | 8 9 10 11 | 12 13 14 15 | 16 17
    query 17 sees sinks 0 1 and the window 12..17 (the last W, itself included)
    blocks      [ sink  ] [released] [released ] [  window   ] [ .. ]
    ReleaseBlocks(rid, num_blocks=3, num_kept=1): positions 1..2 let go, 0 kept

The kept block's tokens past S (2, 3) and the partly passed block's before the window (none
here) stay in memory but are masked by the attention (kernels/streaming_attention.py). The
request holds at most blocks_for(S) + blocks_for(W + one step's tokens) + 2 blocks
(StepLimits.peak_blocks), however long it runs.

KV of a token p < S + W is what full attention computes (its query sees every earlier token at
its own position); later tokens' KV is not. So a streaming request registers, and reuses from
the prefix cache, only blocks wholly inside the first S + W tokens (`cache_limit`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from troupe.actors.core.request_state import Request
from troupe.actors.core.step_limits import StepLimits
from troupe.messages.allocator import CacheBlocks, ReleaseBlocks


def sink_blocks(req: Request, block_size: int) -> int:
    """Leading blocks a streaming request keeps for its sinks (0 otherwise)."""
    return -(-req.num_sink_tokens // block_size) if req.stream_window else 0


def cache_limit(req: Request) -> int:
    """Tokens whose KV the prefix cache may hold for `req` (0: no limit). A prompt scored
    for its logprobs or pooled over its positions takes no hit (1: no whole block): every
    position's final hidden state is computed."""
    params = req.params
    if params.prompt_logprobs is not None or (
        params.pooling and params.pooling.reads_every_position
    ):
        return 1
    return req.num_sink_tokens + req.stream_window if req.stream_window else 0


def window_releases(
    limits: StepLimits, running: Iterable[Request]
) -> Iterator[tuple[ReleaseBlocks, int]]:
    """ReleaseBlocks for the running requests whose window moved past whole blocks since the
    last one, and how many blocks each surely frees (a shared block may stay held by another
    request). Updates each request's num_released (a count: positions let go)."""
    bs = limits.block_size
    for req in running:
        window = req.stream_window
        if not (window or limits.kv_window):
            continue
        kept = sink_blocks(req, bs)
        passed = min(limits.num_passed_blocks(req.num_computed, window), req.num_blocks)
        num_released = passed - kept
        if num_released > req.num_released:
            yield (
                ReleaseBlocks(req.request_id, passed, kept),
                max(0, num_released - req.num_released - req.num_shared),
            )
            req.num_released = num_released


def peak_blocks(limits: StepLimits, req: Request) -> int:
    """The most blocks `req` holds at once (StepLimits.peak_blocks with its own window)."""
    return limits.peak_blocks(req.num_tokens, req.stream_window, req.num_sink_tokens)


def unfit(limits: StepLimits, req: Request) -> str | None:
    """Why a new request could never run here (None: it could): its tokens' blocks, or for a
    streaming one the most it will hold up to max_total_tokens, exceed the whole pool (checked
    before any token), or its samples cannot all run at once."""
    if req.stream_window:
        peak = _streaming_peak(limits, req)
    else:
        peak = limits.blocks_for(req.num_tokens)
    if peak > limits.num_gpu_blocks or not req.token_ids:
        return too_big(limits, req)
    if req.num_samples > min(limits.max_num_seqs, limits.max_num_batched_tokens):
        return f"{req.num_samples} samples cannot run at once (max_num_seqs)"
    return None


def _streaming_peak(limits: StepLimits, req: Request) -> int:
    return limits.peak_blocks(req.max_total_tokens, req.stream_window, req.num_sink_tokens)


def too_big(limits: StepLimits, req: Request) -> str:
    """Why `req` can never run here (its peak, StepLimits.too_big's whole KV otherwise)."""
    if not req.stream_window:
        return limits.too_big(req.num_tokens)
    return (
        f"a streaming request holds up to {_streaming_peak(limits, req)} KV blocks of "
        f"{limits.block_size} tokens (sink_tokens {req.num_sink_tokens} + streaming_window "
        f"{req.stream_window} + one step's {limits.max_num_batched_tokens} tokens), but the GPU "
        f"pool holds only {limits.num_gpu_blocks} (num_kv_blocks)"
    )


def commit_ops(requests: Iterable[Request], block_size: int) -> list[CacheBlocks]:
    """CacheBlocks of each request's full blocks computed since its last (a streaming
    request's: only those inside its cache_limit); counted as committed."""
    ops: list[CacheBlocks] = []
    for req in requests:
        num_full = req.num_computed // block_size
        if req.stream_window:  # only blocks full attention would compute the same
            num_full = min(num_full, cache_limit(req) // block_size)
        if req.in_allocator and num_full > req.num_committed_blocks:
            start = req.num_committed_blocks * block_size
            ops.append(
                CacheBlocks(req.request_id, req.cache_tokens(start, num_full * block_size))
            )
            req.num_committed_blocks = num_full
    return ops
