"""Tokens that come after their step's result (prefill/decode disaggregation: step_join.py).

StepResult.late names the sampled requests whose prompt's last chunk the prefill side was
still computing when the decode side answered the step; a LateTokens brings their tokens
later, in any scheduler phase. In between, a request is AWAITING:

    its chunk counts as computed, and its full blocks are cached: whatever reads them runs
        after that chunk on the prefill side (each side runs its shares in step order, and
        transfers pair up by step), so nothing reads them before they are written
    it keeps its seat and its blocks; it is neither planned nor a preemption victim
    an abort ends it at once: one terminal event, its blocks freed with the next plan (the
        prefill side finishes the chunk before anything of a later step reuses them; the
        decode side's pool is its own); the token, when it comes, is dropped

One executor never answers late: none of this runs.
"""

from __future__ import annotations

from troupe.actors.core.request_queues import RequestQueues
from troupe.actors.core.request_state import Request, Status
from troupe.actors.core.row_failures import failure
from troupe.actors.core.step_planner import StepPlanner
from troupe.messages.common import FinishReason
from troupe.messages.scheduler import LateTokens
from troupe.messages.streamer import SeqOutput


def await_token(planner: StepPlanner, req: Request, end: int, step_id: int) -> None:
    """`req` sampled at `end` in step `step_id`, its token late: hold it until it lands."""
    if req.status == Status.FINISHED:
        return  # ended mid-step: its token is not wanted
    req.num_computed, req.late_step = end, step_id
    lim = planner.limits
    if lim.enable_prefix_caching and end // lim.block_size > req.num_committed_blocks:
        planner.to_commit[req.request_id] = req
    planner.queues.move(req, Status.AWAITING)


def land_tokens(msg: LateTokens, queues: RequestQueues) -> list[SeqOutput]:
    """Append each awaiting request's late token (or fail it); their SeqOutputs."""
    tokens = {s.request_id: s for s in msg.sampled}
    failed = {f.request_id: f.reason for f in msg.failed}
    outputs: list[SeqOutput] = []
    for rid in msg.request_ids:
        req = queues.requests.get(rid)
        if req is None or req.status != Status.AWAITING or req.late_step != msg.step_id:
            continue  # ended while its token was on the way
        token = tokens.get(rid)
        if msg.error is not None or token is None:
            queues.finish(req)
            outputs.append(req.failed(failure(msg.step_id, msg.error, failed.get(rid))))
            continue
        queues.move(req, Status.RUNNING)
        new = (token.token_id,)
        finish_reason = req.append_token(token.token_id)
        stop = token.token_id if finish_reason is FinishReason.STOP else None
        if finish_reason is not None:
            queues.finish(req)
        lp = None if token.logprob is None else (token.logprob,)
        outputs.append(SeqOutput(rid, new, finish_reason, stop, lp, req.num_cached_tokens))
    return outputs
