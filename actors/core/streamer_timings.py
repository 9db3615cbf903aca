"""A request's Timings, from the times the streamer was told (no clock: a replay gives the same).

    arrival ── queue ──► first scheduled ── prefill ──► first token ── decode ──► last token
                                         └──────────────── inference ───────────────┘
    └──────────────────────────────────── e2e (to the terminal event) ─────────────────────►

Arrival is stamped at the client edge (RequestOpened), first scheduled by the scheduler
(TokenBatch.first_scheduled), token times are the steps' StepResult times (TokenBatch.time).
These are vLLM's definitions (vllm/v1/metrics/stats.py), except that vLLM's queue time starts
when its engine core receives the request, after tokenization, and troupe's at arrival.
"""

from __future__ import annotations

from troupe.messages.common import Timings


def request_timings(
    *,
    arrival: float,
    scheduled: float | None,
    first_token: float | None,
    last_token: float | None,
    num_output_tokens: int,
    end: float,
) -> Timings:
    """The phases that began; a phase that never began is None."""
    tpot = decode = inference = prefill = None
    if first_token is not None and last_token is not None:
        decode = last_token - first_token
        if num_output_tokens > 1:
            tpot = decode / (num_output_tokens - 1)
    if scheduled is not None:
        if first_token is not None:
            prefill = first_token - scheduled
        if last_token is not None:
            inference = last_token - scheduled
    return Timings(
        ttft=None if first_token is None else first_token - arrival,
        tpot=tpot,
        e2e=end - arrival,
        queue=None if scheduled is None else scheduled - arrival,
        prefill=prefill,
        decode=decode,
        inference=inference,
    )
