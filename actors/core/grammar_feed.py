"""GrammarFeed: the scheduler's side of structured output (a field of SchedulerCore).

For each StepPlan it sorts the constrained requests that sample in the step:

    sampled in the plan before, one token since -> the grammar has filled its mask ahead from
        that token (the executor sent it straight there): the plan says `ahead_masks_of`
    any other (its first row, back after a preemption) -> a row of ComputeMasks (with the
        spec, on its first row): the grammar fills its mask now

plus the constrained requests the plan releases. The plan says `awaits_masks` when it has rows,
so the executor meets it with both kinds of TokenMasks before sampling. Plans without
constrained requests pass unchanged, with no message; until a constrained request arrives
(`active`), without a look at their rows either.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from troupe.actors.core.plan_builder import InFlight
from troupe.messages.executor import StepPlan
from troupe.messages.grammar import ComputeMasks, GrammarRow


class GrammarFeed:
    """Owns which constrained requests the grammar actor knows and which sampled last step."""

    def __init__(self) -> None:
        self.known: set[str] = set()  # requests whose first row (the spec) went out
        self._last: frozenset[str] = frozenset()  # constrained rows of the last plan
        self._last_step = -1
        self.active = False  # a constrained request was added: plans are read from then on

    def feed(
        self, plan: StepPlan, in_flight: Sequence[InFlight]
    ) -> tuple[StepPlan, ComputeMasks | None]:
        """The plan to send (marked with the masks it waits for) and the grammar's message.

        A request in the last plan that is in this one sampled there (else it would have
        failed, or ended and been released): the executor sent that token to the grammar,
        which answered with its next mask (or its failure) ahead."""
        if not self.active:
            return plan, None
        known = self.known
        released = tuple(r for r in plan.released if r in known)
        known.difference_update(released)
        rows: list[GrammarRow] = []
        sampling: list[str] = []
        for req, _, sample in in_flight:
            spec = req.params.structured_outputs
            if spec is None or not sample:
                continue
            rid = req.request_id
            sampling.append(rid)
            if rid in self._last:
                continue  # its mask was filled ahead
            rows.append(GrammarRow(rid, None if rid in known else spec))
            known.add(rid)
        ahead = len(sampling) > len(rows)
        last_step, self._last, self._last_step = self._last_step, frozenset(sampling), plan.step_id
        if sampling:
            plan = msgspec.structs.replace(
                plan, awaits_masks=bool(rows), ahead_masks_of=last_step if ahead else None
            )
        if not rows and not released:
            return plan, None
        return plan, ComputeMasks(step_id=plan.step_id, rows=tuple(rows), released=released)
