"""GrammarCore: one xgrammar matcher per constrained request; each step's token masks.

Two messages, each answered with TokenMasks to the executor:

    GrammarTokens N (from the executor, the moment masked step N's tokens reach the host):
        accept each token (one batch call), fill every live matcher's next mask (one batch
        fill on xgrammar's threads, without the interpreter lock) -> TokenMasks(ahead=True)
    ComputeMasks N+1 (from the scheduler, beside plan N+1): drop the released matchers; for
        each row (a first row, with the spec; or a request back from a preemption) make or
        find its matcher and fill its mask now -> TokenMasks

The masks of step N+1 need step N's tokens. Going through the scheduler would put the fill on
the host's critical path after its planning and the allocator's round trip; going straight from
the executor, the fill runs while the scheduler plans and the GPU runs step N+1's forward:

    executor:  sample N | GrammarTokens N -> grammar: accept, fill -> TokenMasks(ahead) N
                        | StepResult N    -> scheduler -> allocator -> plan N+1 (+ ComputeMasks
                                             for rows not covered ahead)
    executor:  plan N+1 meets the ahead masks (and any fresh ones), samples N+1

The scheduler's GrammarFeed decides which rows the ahead masks cover (`ahead_masks_of`: every
request that sampled in the plan before). Every token a matcher accepts comes through
GrammarTokens, once, and a matcher is never rolled back: a recompute preemption replays the KV
of tokens the matcher has already accepted. A request whose grammar fails (a spec that will not
compile, a token the matcher refuses) is named in `failed`; the executor gives it no token and
the scheduler fails it alone. A fill that allows no token is a dead end of the client's grammar
(`[ab]\x04` where no token writes 0x04): that request is failed there, before the model samples
a token the grammar would refuse, and named in `dead_ends` too (grammar_writable.dead_end_error
says what the grammar wanted).
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
from troupe.actors.core.grammar_writable import dead_end_error
from troupe.messages.executor import TokenMasks
from troupe.messages.grammar import ComputeMasks, GrammarInbox, GrammarRow, GrammarTokens

if TYPE_CHECKING:
    import xgrammar

log = structlog.get_logger("troupe.grammar")

_ENDED = "sampled past the end of its grammar"
_HEAD_WORDS = 64  # a mask's first 2048 token ids: read for every row to find dead ends


def _accept_all(matchers: Sequence[xgrammar.GrammarMatcher], tokens: list[int]) -> list[bool]:
    """Each matcher accepts its token, in one call. xgrammar 0.2.8's public batch_accept_token
    reads its result back one element (one call, one release of the interpreter lock) at a
    time: beside a busy event loop, 256 rows took 35 ms at a 0.5 ms switch interval and 280 ms
    at 5 ms on the H200's host (0.8 ms alone). Its core function answers in one piece."""
    if not matchers:
        return []
    from xgrammar.base import _core  # type: ignore[attr-defined]

    handles = [m._handle for m in matchers]
    return [bool(ok) for ok in _core.BatchGrammarMatcher.batch_accept_token(handles, tokens, False)]


class MaskBuffers:
    """Where GrammarCore fills each TokenMasks' bits, and how they become the message's bytes:
    here fresh arrays and a copy. The grammar process fills them in its shared file and sends
    none (actors/grammar_process.py): two copies of ~5 MB less per masked step."""

    def array(self, rows: int, num_words: int) -> np.ndarray:
        """int32 [rows, num_words] to fill (contents undefined)."""
        return np.empty((rows, num_words), dtype=np.int32)

    def seal(self, array: np.ndarray) -> bytes:
        """The bytes the message carries for `array`, the last one made."""
        return array.tobytes()


class GrammarCore:
    """Inbox: ComputeMasks, GrammarTokens. Outbox: "executor" (TokenMasks: one per ComputeMasks
    with rows, one `ahead` per GrammarTokens)."""

    def __init__(
        self,
        compiler: GrammarCompiler,
        *,
        max_threads: int = 4,
        buffers: MaskBuffers | None = None,
    ) -> None:
        self.compiler = compiler
        self.num_words = (compiler.vocab_size + 31) // 32
        self.matchers: dict[str, xgrammar.GrammarMatcher] = {}
        self._broken: dict[str, str] = {}  # request id -> why its grammar failed
        self._dead_ends: set[str] = set()  # of those, the ones whose grammar dead-ended
        self._max_threads = max_threads
        self._buffers = MaskBuffers() if buffers is None else buffers

    @functools.cached_property
    def _batch(self) -> xgrammar.BatchGrammarMatcher:
        """Made at the first constrained row: importing xgrammar (which pulls in transformers)
        takes 1-3 s of start-up on a small CPU, and most engines never need it."""
        import xgrammar

        return xgrammar.BatchGrammarMatcher(min(self._max_threads, os.cpu_count() or 1))

    def handle(self, batch: Sequence[GrammarInbox]) -> Outgoing:
        out: Outgoing = []
        for msg in batch:
            masks = self.ahead(msg) if isinstance(msg, GrammarTokens) else self.masks(msg)
            if masks is not None:
                out.append(("executor", masks))
        return out

    def ahead(self, msg: GrammarTokens) -> TokenMasks:
        """Accept a masked step's tokens now; every request's next mask (or its failure).

        Each call into xgrammar lets go of the interpreter lock and waits to take it back
        while the event loop runs the scheduler (config.gil_switch_interval_s), so a step makes
        two: one batch accept, one batch fill; a matcher that accepted a stop token is known
        to have ended without asking it."""
        matchers, rids, tokens = self.matchers, [], []
        for rid, token_id in zip(msg.request_ids, msg.token_ids, strict=True):
            if rid in matchers:  # else broken, or released before its token came back
                rids.append(rid)
                tokens.append(token_id)
        known = [matchers[rid] for rid in rids]
        accepted = _accept_all(known, tokens)
        stop = self.compiler.eos_token_ids
        live_ids: list[str] = []
        live: list[xgrammar.GrammarMatcher] = []
        ended: list[tuple[str, str]] = []
        for rid, matcher, token_id, ok in zip(rids, known, tokens, accepted, strict=True):
            if not ok:
                log.warning("grammar refused a token", request_id=rid, token_id=token_id)
                self._fail(rid, f"its grammar refused token {token_id}")
            elif token_id in stop:  # a stop token accepted: the matcher has terminated
                ended.append((rid, _ENDED))
            else:
                live_ids.append(rid)
                live.append(matcher)
        failed = [(rid, self._broken[rid]) for rid in msg.request_ids if rid in self._broken]
        failed += ended
        request_ids = tuple(live_ids) + tuple(rid for rid, _ in failed)
        bitmask = self._buffers.array(len(live) + len(failed), self.num_words)
        bitmask[len(live) :] = 0  # nothing may follow
        if live:
            self._batch.batch_fill_next_token_bitmask(live, bitmask[: len(live)])
            failed += self._fail_dead_ends(live_ids, live, bitmask, range(len(live)))
        return TokenMasks(
            step_id=msg.step_id,
            request_ids=request_ids,
            num_words=self.num_words,
            bitmask=self._buffers.seal(bitmask),
            failed=tuple(failed),
            ahead=True,
            dead_ends=self._dead_ends_of(failed),
        )

    def masks(self, msg: ComputeMasks) -> TokenMasks | None:
        """Release, find or make each row's matcher, fill: the step's TokenMasks (None when it has
        no rows)."""
        for request_id in msg.released:
            self.matchers.pop(request_id, None)
            self._broken.pop(request_id, None)
            self._dead_ends.discard(request_id)
        if not msg.rows:
            return None
        bitmask = self._buffers.array(len(msg.rows), self.num_words)
        bitmask[:] = -1
        live: list[xgrammar.GrammarMatcher] = []
        indices: list[int] = []
        failed: list[tuple[str, str]] = []
        for index, row in enumerate(msg.rows):
            matcher = self._matcher(row)
            if matcher is None:
                failed.append((row.request_id, self._broken[row.request_id]))
            elif matcher.is_terminated():
                bitmask[index] = 0  # it accepted a stop token: nothing more may follow
                failed.append((row.request_id, _ENDED))
            else:
                live.append(matcher)
                indices.append(index)
        if live:
            self._batch.batch_fill_next_token_bitmask(live, bitmask, indices)
            live_ids = [msg.rows[i].request_id for i in indices]
            failed += self._fail_dead_ends(live_ids, live, bitmask, indices)
        return TokenMasks(
            step_id=msg.step_id,
            request_ids=tuple(row.request_id for row in msg.rows),
            num_words=self.num_words,
            bitmask=self._buffers.seal(bitmask),
            failed=tuple(failed),
            dead_ends=self._dead_ends_of(failed),
        )

    def _matcher(self, row: GrammarRow) -> xgrammar.GrammarMatcher | None:
        """The row's matcher, made from its spec on its first row; None, and a reason in
        _broken, if broken."""
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
        return matcher

    def _fail_dead_ends(
        self,
        request_ids: Sequence[str],
        matchers: Sequence[xgrammar.GrammarMatcher],
        bitmask: np.ndarray,
        rows: Sequence[int],
    ) -> list[tuple[str, str]]:
        """Fail the matchers whose rows of `bitmask` (just filled: `rows[i]` is matcher i's)
        allow no token: their (request id, why). A dead end is rare (and probed then): most
        rows allow some token among the vocabulary's first 2048, so only the others are read
        whole (on a dev CPU, 256 rows of a 152k vocabulary: 0.25 ms whole, 0.01 ms heads)."""
        index = np.asarray(rows, dtype=np.intp)
        unsure = np.flatnonzero(~bitmask[index, :_HEAD_WORDS].any(axis=1))
        out = []
        for i in unsure.tolist():
            if bitmask[index[i]].any():
                continue
            request_id = request_ids[i]
            why = dead_end_error(matchers[i])
            log.info("grammar dead end", request_id=request_id, why=why)
            self._fail(request_id, why)
            self._dead_ends.add(request_id)
            out.append((request_id, why))
        return out

    def _dead_ends_of(self, failed: Sequence[tuple[str, str]]) -> tuple[str, ...]:
        return tuple(rid for rid, _ in failed if rid in self._dead_ends)

    def _fail(self, request_id: str, why: str) -> None:
        self._broken[request_id] = why
        self.matchers.pop(request_id, None)
