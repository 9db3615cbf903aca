"""GrammarCore: one xgrammar matcher per constrained request; each step's token masks.

Per ComputeMasks (one per step that samples constrained requests):

    released -> drop those matchers
    rows     -> per row: the matcher (made from the compiled spec on its first row), advanced
                by the tokens sampled since its last row; then one batch fill of every row's
                bitmask (xgrammar's threads) -> TokenMasks to the executor

The scheduler sends ComputeMasks beside the StepPlan, so the masks are computed on the CPU
while the executor runs the forward pass; the executor meets the two before sampling. A matcher
is never rolled back: a recompute preemption replays the KV of tokens the matcher has already
accepted, and the rows carry only tokens it has not seen. A request whose grammar fails (a spec
that will not compile, a token the matcher refuses) is named in `failed`; the executor gives it
no token and the scheduler fails it alone.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import structlog
from troupe.actors.core.base import Outgoing
from troupe.actors.core.grammar_compiler import GrammarCompiler, GrammarError
from troupe.messages.executor import TokenMasks
from troupe.messages.grammar import ComputeMasks, GrammarInbox, GrammarRow

if TYPE_CHECKING:
    import xgrammar

log = structlog.get_logger("troupe.grammar")


class GrammarCore:
    """Inbox: ComputeMasks. Outbox: "executor" (TokenMasks, one per ComputeMasks with rows)."""

    def __init__(self, compiler: GrammarCompiler, *, max_threads: int = 4) -> None:
        self.compiler = compiler
        self.num_words = (compiler.vocab_size + 31) // 32
        self.matchers: dict[str, xgrammar.GrammarMatcher] = {}
        self._broken: dict[str, str] = {}  # request id -> why its grammar failed
        self._max_threads = max_threads

    @functools.cached_property
    def _batch(self) -> xgrammar.BatchGrammarMatcher:
        """Made at the first constrained row: importing xgrammar (which pulls in transformers)
        takes 1-3 s of start-up on a small CPU, and most engines never need it."""
        import xgrammar

        return xgrammar.BatchGrammarMatcher(min(self._max_threads, os.cpu_count() or 1))

    def handle(self, batch: Sequence[GrammarInbox]) -> Outgoing:
        out: Outgoing = []
        for msg in batch:
            masks = self.masks(msg)
            if masks is not None:
                out.append(("executor", masks))
        return out

    def masks(self, msg: ComputeMasks) -> TokenMasks | None:
        """Release, advance, fill: the step's TokenMasks (None when it has no rows)."""
        for request_id in msg.released:
            self.matchers.pop(request_id, None)
            self._broken.pop(request_id, None)
        if not msg.rows:
            return None
        bitmask = np.full((len(msg.rows), self.num_words), -1, dtype=np.int32)
        live: list[xgrammar.GrammarMatcher] = []
        indices: list[int] = []
        failed: list[tuple[str, str]] = []
        for index, row in enumerate(msg.rows):
            matcher = self._advance(row)
            if matcher is None:
                failed.append((row.request_id, self._broken[row.request_id]))
            elif matcher.is_terminated():
                bitmask[index] = 0  # it accepted a stop token: nothing more may follow
                failed.append((row.request_id, "sampled past the end of its grammar"))
            else:
                live.append(matcher)
                indices.append(index)
        if live:
            self._batch.batch_fill_next_token_bitmask(live, bitmask, indices)
        return TokenMasks(
            step_id=msg.step_id,
            request_ids=tuple(row.request_id for row in msg.rows),
            num_words=self.num_words,
            bitmask=bitmask.tobytes(),
            failed=tuple(failed),
        )

    def _advance(self, row: GrammarRow) -> xgrammar.GrammarMatcher | None:
        """The row's matcher after its new tokens; None (and a reason in _broken) if broken."""
        request_id = row.request_id
        if request_id in self._broken:
            return None
        matcher = self.matchers.get(request_id)
        if matcher is None:
            if row.spec is None:
                self._broken[request_id] = "no grammar spec reached the grammar actor"
                return None
            try:
                compiled = self.compiler.compile(row.spec)
            except GrammarError as exc:
                self._broken[request_id] = str(exc)
                return None
            import xgrammar

            matcher = xgrammar.GrammarMatcher(compiled)
            self.matchers[request_id] = matcher
        for token_id in row.new_token_ids:
            if not matcher.accept_token(token_id):
                log.warning("grammar refused a token", request_id=request_id, token_id=token_id)
                self._broken[request_id] = f"its grammar refused token {token_id}"
                del self.matchers[request_id]
                return None
        return matcher
