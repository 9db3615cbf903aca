"""Inbox of the Grammar actor: one ComputeMasks per step that samples constrained requests,
and the executor's GrammarTokens after each masked step.

The scheduler sends ComputeMasks beside the StepPlan; the grammar actor advances each request's
matcher by the tokens sampled since its last row and answers the executor with the step's
TokenMasks (messages/executor.py), computed on the CPU while the executor runs the forward pass.
GrammarTokens come straight from the executor the moment a masked step's tokens reach the host,
so the grammar advances its matchers and fills the likely next masks while the scheduler is
still planning; ComputeMasks then finds them ready (actors/core/grammar.py).
"""

from __future__ import annotations

import msgspec
from troupe.messages.structured import StructuredOutputs


class GrammarRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One constrained request that samples this step."""

    request_id: str
    new_token_ids: tuple[int, ...]  # output tokens sampled since this request's last row
    spec: StructuredOutputs | None = None  # its first row only: what to compile and match


class ComputeMasks(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """Masks for step `step_id`'s constrained rows; drop the matchers of `released` first."""

    step_id: int
    rows: tuple[GrammarRow, ...] = ()  # no rows: only releases, nothing is answered
    released: tuple[str, ...] = ()


class GrammarTokens(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """From the executor: the tokens masked step `step_id` sampled, one per constrained request
    that got one (the scheduler's next rows carry them again: the grammar skips what it saw)."""

    step_id: int
    request_ids: tuple[str, ...]
    token_ids: tuple[int, ...]


GrammarInbox = ComputeMasks | GrammarTokens
