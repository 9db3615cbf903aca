"""GrammarFeed: the scheduler's side of structured output (a field of SchedulerCore).

For each StepPlan it builds the grammar actor's ComputeMasks: one row per constrained request
that samples in the step, carrying the output tokens the grammar actor has not seen yet (and
the spec, on the request's first row), plus the constrained requests the plan releases. The
plan then says `awaits_masks`, so the executor meets it with the TokenMasks before sampling.
Plans without constrained requests pass unchanged: no message, no cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from troupe.actors.core.plan_builder import InFlight
from troupe.messages.executor import StepPlan
from troupe.messages.grammar import ComputeMasks, GrammarRow


class GrammarFeed:
    """Owns how many output tokens of each constrained request the grammar actor has seen."""

    def __init__(self) -> None:
        self.num_seen: dict[str, int] = {}  # request id -> output tokens sent to the grammar

    def feed(
        self, plan: StepPlan, in_flight: Sequence[InFlight]
    ) -> tuple[StepPlan, ComputeMasks | None]:
        """The plan to send (marked when it awaits masks) and the grammar actor's message."""
        num_seen = self.num_seen
        released = tuple(r for r in plan.released if num_seen.pop(r, None) is not None)
        rows: list[GrammarRow] = []
        for req, _, sample in in_flight:
            spec = req.params.structured_outputs
            if spec is None or not sample:
                continue
            rid = req.request_id
            seen = num_seen.get(rid)
            outputs = req.token_ids[req.prompt_len :]
            new = tuple(outputs[seen or 0 :])
            rows.append(GrammarRow(rid, new, spec if seen is None else None))
            num_seen[rid] = len(outputs)
        if not rows and not released:
            return plan, None
        msg = ComputeMasks(step_id=plan.step_id, rows=tuple(rows), released=released)
        if rows:
            plan = msgspec.structs.replace(plan, awaits_masks=True)
        return plan, msg
