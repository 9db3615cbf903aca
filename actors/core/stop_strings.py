"""Stop strings over a text stream: match across token boundaries, never leak a partial match.

Text arrives in deltas. A stop string may start in one delta and end two deltas later, so the
matcher holds back the longest suffix of what it has seen that could still grow into a stop
string, and releases it once it cannot:

    stop = "END"      feed("the E") -> "the "   (hold "E")
                      feed("N")     -> ""       (hold "EN")
                      feed("D!")    -> match: output stops before "END"; "!" is dropped
    false start:      feed("the E") -> "the ", feed("x") -> "Ex"

Text passed through `skip` (tokens before min_tokens, as vLLM has it) is emitted unmatched but
kept as context: a stop string may start in it and end in fed text (the client has already seen
its start; the output ends there).
"""

from __future__ import annotations

from collections.abc import Sequence

from troupe.actors.core.marker_tail import marker_tail


class StopStringMatcher:
    """Per-request stop-string state. Empty `stops` makes it a pass-through."""

    def __init__(self, stops: Sequence[str], *, include_in_output: bool = False) -> None:
        if any(not stop for stop in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._include = include_in_output
        self._held = ""  # seen, not emitted: could grow into a stop string
        self._context = ""  # the end of the emitted text a stop string may start in
        self._lookback = max((len(stop) for stop in self._stops), default=1) - 1
        self.matched: str | None = None  # the stop string that ended the stream, once it has

    def feed(self, text: str) -> str:
        """Text that is safe to emit after appending `text`. After a match, returns the text up
        to the match (or through it, when included) and ignores all later input."""
        if self.matched is not None:
            return ""
        if not self._stops:
            return text
        emitted = len(self._context)
        buffer = self._context + self._held + text
        match = self._earliest_match(buffer, emitted)
        if match is not None:
            start, stop = match
            self.matched = stop
            self._held = self._context = ""
            return buffer[emitted : start + len(stop)] if self._include else buffer[emitted:start]
        keep = min(marker_tail(buffer, self._stops), len(buffer) - emitted)
        self._held = buffer[len(buffer) - keep :]
        out = buffer[emitted : len(buffer) - keep]
        if emitted:  # only after skip: the held suffix alone carries a fed stream's matches
            self._remember(out)
        return out

    def skip(self, text: str) -> str:
        """Emit `text` unmatched, keeping its end as context for the text fed later."""
        if self._stops and self.matched is None:
            self._remember(self._held + text)  # nothing is held across skips: flush it
            text, self._held = self._held + text, ""
        return text

    def _remember(self, emitted: str) -> None:
        if self._lookback:
            self._context = (self._context + emitted)[-self._lookback :]

    def flush(self) -> str:
        """At the end of the stream: the held-back text, which turned out not to be a stop."""
        held, self._held = self._held, ""
        return held

    def _earliest_match(self, buffer: str, emitted: int) -> tuple[int, str] | None:
        # The match that completes first wins, as it would token by token, so the result does
        # not depend on how the text was cut into deltas; on a tie, the earliest start (the
        # longer stop), then the stop listed first. Only a match that ends past the `emitted`
        # context counts (the context itself never held a whole stop that could match).
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = buffer.find(stop, max(0, emitted - len(stop) + 1))
            if start >= 0:
                found = (start + len(stop), start, stop)
                if best is None or found[:2] < best[:2]:
                    best = found
        return None if best is None else (best[1], best[2])
