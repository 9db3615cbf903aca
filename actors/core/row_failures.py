"""Requests a step ends without a token, each alone: nothing of that step is committed or
cached for them. A step that failed as a whole (StepResult.error) fails every request it
computed; the executor fails single rows (StepResult.failed: non-finite logits) and may return
no token for a row. Late tokens (late_tokens.py) end the same three ways."""

from __future__ import annotations

from collections.abc import Iterable

from troupe.actors.core.plan_builder import InFlight
from troupe.actors.core.request_queues import RequestQueues
from troupe.actors.core.request_state import Status
from troupe.messages.events import FailureCause
from troupe.messages.scheduler import SeqFailureReason, StepResult
from troupe.messages.streamer import SeqOutput

NO_TOKEN = "the executor returned no token for it"


def failure(step_id: int, error: str | None, reason: str | None, detail: str | None = None) -> str:
    """The message of a request that step `step_id` ends: the step's `error`, else its row's."""
    if error is not None:
        return f"step failed: {error}"
    if reason is None:
        return NO_TOKEN
    return f"{reason} at step {step_id}" + ("" if detail is None else f": {detail}")


def fail_rows(
    result: StepResult, in_flight: Iterable[InFlight], queues: RequestQueues
) -> list[SeqOutput]:
    """End the requests `result` fails (all of the step's if it failed, else the sampling rows
    it names); their terminal outputs. Requests ended mid-step are skipped. A row whose
    grammar dead-ended fails as the client's fault (FailureCause.GRAMMAR_DEAD_END)."""
    rows = {f.request_id: f for f in result.failed}
    outputs: list[SeqOutput] = []
    step_failed = result.error is not None
    for req, _, sample in in_flight:
        rid = req.request_id
        if req.status != Status.FINISHED and (step_failed or (sample and rid in rows)):
            queues.finish(req)
            row = None if step_failed else rows[rid]
            if row is None:
                outputs.append(req.failed(failure(result.step_id, result.error, None)))
            elif row.reason is SeqFailureReason.GRAMMAR_DEAD_END:
                message = failure(result.step_id, None, row.reason, row.detail)
                outputs.append(req.failed(message, FailureCause.GRAMMAR_DEAD_END))
            else:
                outputs.append(req.failed(failure(result.step_id, None, row.reason, row.detail)))
    return outputs
