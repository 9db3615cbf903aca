"""Inbox of the Grammar actor: one ComputeMasks per step that samples constrained requests,
and the executor's GrammarTokens after each masked step.

GrammarTokens come straight from the executor the moment a masked step's tokens reach the
host: the grammar advances those matchers and answers every one's next mask ahead, while the
scheduler is still planning (actors/core/grammar.py). ComputeMasks comes with a StepPlan whose
constrained rows are not all covered by those: the grammar answers the executor with the
step's TokenMasks (messages/executor.py) while the executor runs the forward pass.
"""

from __future__ import annotations

import msgspec
from troupe.messages.structured import StructuredOutputs


class GrammarRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One constrained request whose mask this step is filled now: its first row (with the
    spec), or one that did not sample in the step before (back from a preemption). Tokens come
    only through GrammarTokens."""

    request_id: str
    spec: StructuredOutputs | None = None  # its first row only: what to compile and match


class ComputeMasks(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """Masks for step `step_id`'s constrained rows; drop the matchers of `released` first."""

    step_id: int
    rows: tuple[GrammarRow, ...] = ()  # no rows: only releases, nothing is answered
    released: tuple[str, ...] = ()


class GrammarTokens(msgspec.Struct, frozen=True, kw_only=True, tag=True, gc=False):
    """From the executor: the tokens masked step `step_id` sampled, one per constrained request
    that got one (every token a matcher accepts comes this way)."""

    step_id: int
    request_ids: tuple[str, ...]
    token_ids: tuple[int, ...]


GrammarInbox = ComputeMasks | GrammarTokens
