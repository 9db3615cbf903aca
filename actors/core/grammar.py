"""GrammarCore: one xgrammar matcher per constrained request; each step's token masks.

Per ComputeMasks (one per step that samples constrained requests):

    released -> drop those matchers
    rows     -> per row: the matcher (made from the compiled spec on its first row), advanced
                by the tokens sampled since its last row; then one batch fill of every row's
                bitmask (xgrammar's threads) -> TokenMasks to the executor

The scheduler sends ComputeMasks beside the StepPlan, so the masks are computed on the CPU
while the executor runs the forward pass; the executor meets the two before sampling.

Masks ahead. The masks of step N+1 need step N's tokens, so without help the fill sits on the
host's critical path after the scheduler's planning. The executor therefore sends GrammarTokens
the moment step N's tokens reach the host; the grammar accepts them and fills every live row's
next mask at once (xgrammar's threads run without the GIL, beside the scheduler):

    executor:  sample N | GrammarTokens N -> grammar: accept, fill ahead (rows of step N)
                        | StepResult N    -> scheduler: plan N+1, ComputeMasks N+1 -> grammar
    grammar, ComputeMasks N+1: a row whose new tokens are exactly those accepted ahead takes
                        its mask from the ahead fill; any other row is advanced and filled now

The ahead tokens stay pending per request until a row carries them (they must match: the
scheduler appends every sampled token), so the matcher never accepts a token twice. A matcher
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
from troupe.messages.grammar import ComputeMasks, GrammarInbox, GrammarRow, GrammarTokens

if TYPE_CHECKING:
    import xgrammar

log = structlog.get_logger("troupe.grammar")


class GrammarCore:
    """Inbox: ComputeMasks, GrammarTokens. Outbox: "executor" (TokenMasks, one per ComputeMasks
    with rows)."""

    def __init__(self, compiler: GrammarCompiler, *, max_threads: int = 4) -> None:
        self.compiler = compiler
        self.num_words = (compiler.vocab_size + 31) // 32
        self.matchers: dict[str, xgrammar.GrammarMatcher] = {}
        self._broken: dict[str, str] = {}  # request id -> why its grammar failed
        self._max_threads = max_threads
        self._pending: dict[str, list[int]] = {}  # tokens accepted ahead, not yet in a row
        self._ahead_rows: dict[str, int] = {}  # request id -> its row in _ahead
        self._ahead = np.empty((0, self.num_words), dtype=np.int32)
        self.num_ahead_hits = 0  # rows whose mask the ahead fill had ready (benchmarks)

    @functools.cached_property
    def _batch(self) -> xgrammar.BatchGrammarMatcher:
        """Made at the first constrained row: importing xgrammar (which pulls in transformers)
        takes 1-3 s of start-up on a small CPU, and most engines never need it."""
        import xgrammar

        return xgrammar.BatchGrammarMatcher(min(self._max_threads, os.cpu_count() or 1))

    def handle(self, batch: Sequence[GrammarInbox]) -> Outgoing:
        out: Outgoing = []
        for msg in batch:
            if isinstance(msg, GrammarTokens):
                self.ahead(msg)
                continue
            masks = self.masks(msg)
            if masks is not None:
                out.append(("executor", masks))
        return out

    def ahead(self, msg: GrammarTokens) -> None:
        """Accept a masked step's tokens now and fill the next masks of every live matcher.
        One call each into xgrammar: every call that releases the interpreter lock waits to
        take it back while the scheduler runs (config.gil_switch_interval_s)."""
        rids: list[str] = []
        matchers: list[xgrammar.GrammarMatcher] = []
        tokens: list[int] = []
        for request_id, token_id in zip(msg.request_ids, msg.token_ids, strict=True):
            matcher = self.matchers.get(request_id)
            if matcher is not None:  # else broken, or released before its token came back
                rids.append(request_id)
                matchers.append(matcher)
                tokens.append(token_id)
        accepted = self._batch.batch_accept_token(matchers, tokens) if matchers else []
        live: list[xgrammar.GrammarMatcher] = []
        rows: dict[str, int] = {}
        for request_id, matcher, token_id, ok in zip(rids, matchers, tokens, accepted, strict=True):
            if not ok:
                log.warning("grammar refused a token", request_id=request_id, token_id=token_id)
                self._fail(request_id, f"its grammar refused token {token_id}")
                continue
            self._pending.setdefault(request_id, []).append(token_id)
            if not matcher.is_terminated():
                rows[request_id] = len(live)
                live.append(matcher)
        self._ahead_rows = rows
        if live:
            if self._ahead.shape[0] < len(live):
                self._ahead = np.empty((len(live), self.num_words), dtype=np.int32)
            self._batch.batch_fill_next_token_bitmask(live, self._ahead[: len(live)])

    def masks(self, msg: ComputeMasks) -> TokenMasks | None:
        """Release, advance, fill: the step's TokenMasks (None when it has no rows)."""
        for request_id in msg.released:
            self.matchers.pop(request_id, None)
            self._broken.pop(request_id, None)
            self._pending.pop(request_id, None)
            self._ahead_rows.pop(request_id, None)
        if not msg.rows:
            return None
        live: list[xgrammar.GrammarMatcher] = []
        indices: list[int] = []
        failed: list[tuple[str, str]] = []
        done: list[int] = []  # rows of stopped matchers: nothing more may follow
        ready: list[int] = []  # per row, its row in the ahead fill (-1: none)
        ahead, self._ahead_rows = self._ahead_rows, {}  # good for this step only
        for index, row in enumerate(msg.rows):
            matcher, moved = self._advance(row)
            ready.append(-1)
            if matcher is None:
                failed.append((row.request_id, self._broken[row.request_id]))
            elif matcher.is_terminated():
                done.append(index)
                failed.append((row.request_id, "sampled past the end of its grammar"))
            elif not moved and row.request_id in ahead:
                ready[-1] = ahead[row.request_id]
            else:
                live.append(matcher)
                indices.append(index)
        self.num_ahead_hits += sum(r >= 0 for r in ready)
        if ready == list(range(len(ready))):  # the ahead fill is this step's: no copy
            bitmask = self._ahead[: len(ready)]
        else:
            bitmask = np.full((len(msg.rows), self.num_words), -1, dtype=np.int32)
            for index, row_ahead in enumerate(ready):
                if row_ahead >= 0:
                    bitmask[index] = self._ahead[row_ahead]
            bitmask[done] = 0
        if live:
            self._batch.batch_fill_next_token_bitmask(live, bitmask, indices)
        return TokenMasks(
            step_id=msg.step_id,
            request_ids=tuple(row.request_id for row in msg.rows),
            num_words=self.num_words,
            bitmask=bitmask.tobytes(),
            failed=tuple(failed),
        )

    def _advance(self, row: GrammarRow) -> tuple[xgrammar.GrammarMatcher | None, bool]:
        """The row's matcher after its new tokens (None, and a reason in _broken, if broken),
        and whether it accepted any here (the ahead tokens it skips do not count)."""
        request_id = row.request_id
        if request_id in self._broken:
            return None, False
        new = row.new_token_ids
        pending = self._pending.pop(request_id, None)
        if pending:
            if list(new[: len(pending)]) != pending:
                self._fail(request_id, "the tokens its grammar accepted ahead are not its own")
                return None, False
            new = new[len(pending) :]
        matcher = self.matchers.get(request_id)
        if matcher is None:
            if row.spec is None:
                self._broken[request_id] = "no grammar spec reached the grammar actor"
                return None, False
            try:
                compiled = self.compiler.compile(row.spec)
            except GrammarError as exc:
                self._broken[request_id] = str(exc)
                return None, False
            import xgrammar

            matcher = xgrammar.GrammarMatcher(compiled)
            self.matchers[request_id] = matcher
        if not self._accept(request_id, matcher, new):
            return None, False
        return matcher, bool(new)

    def _accept(
        self, request_id: str, matcher: xgrammar.GrammarMatcher, token_ids: Sequence[int]
    ) -> bool:
        """Feed `token_ids` to the matcher; False (the request broken) at the first refusal."""
        for token_id in token_ids:
            if not matcher.accept_token(token_id):
                log.warning("grammar refused a token", request_id=request_id, token_id=token_id)
                self._fail(request_id, f"its grammar refused token {token_id}")
                return False
        return True

    def _fail(self, request_id: str, why: str) -> None:
        self._broken[request_id] = why
        self.matchers.pop(request_id, None)
        self._pending.pop(request_id, None)
