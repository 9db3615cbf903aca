"""A step's sampled tokens land in their requests: the scheduler's update once row_failures.py
has ended the rows the step failed.

Each request the step computed now holds KV up to its end position, and its new full blocks wait
for the next plan to cache them (`StepPlanner.to_commit`). A row that samples appends its token
(a verification: the accepted proposals too, `Speculator.land`) and gets its SeqOutput; a finish
reason on it ends the request. A row whose token comes later waits for it (late_tokens.py). A
request aborted or stopped mid-step is skipped: its KV and its token are not wanted.
"""

from __future__ import annotations

from collections.abc import Sequence

from troupe.actors.core.late_tokens import await_token
from troupe.actors.core.plan_builder import InFlight
from troupe.actors.core.request_state import Status
from troupe.actors.core.row_failures import NO_TOKEN
from troupe.actors.core.step_planner import StepPlanner
from troupe.messages.common import FinishReason
from troupe.messages.scheduler import SampledToken, StepResult
from troupe.messages.streamer import SeqOutput


def apply_tokens(
    result: StepResult,
    in_flight: Sequence[InFlight],
    planner: StepPlanner,
    outputs: list[SeqOutput],
) -> None:
    """Land `result`'s tokens in the `in_flight` requests; their SeqOutputs go to `outputs`."""
    sampled, speculator = result.sampled, planner.speculator
    late = result.late or None  # None: the loop's test needs no call
    # Tokens come in plan order; a dict is built only if the executor broke that order.
    by_id: dict[str, SampledToken] | None = None
    i, num_sampled = 0, len(sampled)
    bs, caching = planner.limits.block_size, planner.limits.enable_prefix_caching
    to_commit, finish, append = planner.to_commit, planner.queues.finish, outputs.append
    finished, speculating = Status.FINISHED, speculator.enabled
    stop_reason, length = FinishReason.STOP, FinishReason.LENGTH
    for req, end, sample in in_flight:
        if sample:
            if late is not None and req.request_id in late:  # its token comes later
                await_token(planner, req, end, result.step_id)
                continue
            i += 1
        if req.status is finished:
            continue
        req.num_computed = end
        rid = req.request_id
        if caching and end // bs > req.num_committed_blocks:
            to_commit[rid] = req
        if not sample:
            continue
        if by_id is not None or i > num_sampled or (token := sampled[i - 1]).request_id != rid:
            by_id = by_id or {s.request_id: s for s in sampled}
            if (found := by_id.get(rid)) is None:
                finish(req)
                append(req.failed(NO_TOKEN))
                continue
            token = found
        if speculating and (out := speculator.land(req, token, end)) is not None:
            if caching:  # the next plan caches the blocks its accepted tokens filled, if any
                to_commit[rid] = req
            append(out)
            if out.finish_reason is not None:
                finish(req)
            continue
        # Request.append_token, inlined, one output per branch: this loop runs once per row
        # per step, and a call or a shared tail here costs ~5% of `troupe bench scheduler`
        token_id, tokens = token.token_id, req.token_ids
        tokens.append(token_id)
        lp = None if token.logprob is None else (token.logprob,)
        if token_id in req.stop_ids:
            finish(req)
            append(SeqOutput(rid, (token_id,), stop_reason, token_id, lp, req.num_cached_tokens))
        elif len(tokens) >= req.max_total_tokens:
            finish(req)
            append(SeqOutput(rid, (token_id,), length, None, lp, req.num_cached_tokens))
        else:
            append(SeqOutput(rid, (token_id,), None, None, lp, req.num_cached_tokens))
