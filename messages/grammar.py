"""Inbox of the Grammar actor: one ComputeMasks per step that samples constrained requests.

The scheduler sends it beside the StepPlan; the grammar actor advances each request's matcher
by the tokens sampled since its last row and answers the executor with the step's TokenMasks
(messages/executor.py), computed on the CPU while the executor runs the forward pass.
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


GrammarInbox = ComputeMasks
