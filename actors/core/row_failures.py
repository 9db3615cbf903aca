"""Requests a step ends without a token, each alone: nothing of that step is committed or
cached for them. A step that failed as a whole (StepResult.error) fails every request it
computed; the executor fails single rows (StepResult.failed: non-finite logits) and may return
no token for a row. Late tokens (late_tokens.py) end the same three ways."""

from __future__ import annotations

from collections.abc import Iterable

from troupe.actors.core.plan_builder import InFlight
from troupe.actors.core.request_queues import RequestQueues
from troupe.actors.core.request_state import Status
from troupe.messages.scheduler import StepResult
from troupe.messages.streamer import SeqOutput

NO_TOKEN = "the executor returned no token for it"


def failure(step_id: int, error: str | None, reason: str | None) -> str:
    """The message of a request that step `step_id` ends: the step's `error`, else its row's."""
    if error is not None:
        return f"step failed: {error}"
    return NO_TOKEN if reason is None else f"{reason} at step {step_id}"


def fail_rows(
    result: StepResult, in_flight: Iterable[InFlight], queues: RequestQueues
) -> list[SeqOutput]:
    """End the requests `result` fails (all of the step's if it failed, else the sampling rows
    it names); their terminal outputs. Requests ended mid-step are skipped."""
    reasons = {f.request_id: f.reason for f in result.failed}
    outputs: list[SeqOutput] = []
    step_failed = result.error is not None
    for req, _, sample in in_flight:
        rid = req.request_id
        if req.status != Status.FINISHED and (step_failed or (sample and rid in reasons)):
            queues.finish(req)
            outputs.append(req.failed(failure(result.step_id, result.error, reasons.get(rid))))
    return outputs
