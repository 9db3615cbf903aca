"""An answer that a reasoning model wraps in tags after its thinking (Hunyuan-A13B's

    <think>
    ...
    </think>
    <answer>
    Paris.
    </answer>

), or ERNIE 4.5 Thinking's `<response>`: its content without them, whole or streamed
(gateway/reasoning.py feeds it the content that the thinking tags leave). The opening tag
counts only where it leads the content (after whitespace), and takes its newline with it; a
closing tag anywhere is dropped, with the newline before it, and so is whitespace after it
that nothing else follows. Content without the tags passes through as it is. Held back: a
lead that may still become the opening tag, a tail that may begin a closing one, whitespace
after a closing tag.
"""

from __future__ import annotations

from troupe.actors.core.marker_tail import first_marker, marker_tail


class AnswerTags:
    """One answer's content, fed in pieces: each piece's text without the tags."""

    def __init__(self, opening: str, closing: str) -> None:
        self.opening = opening
        self.closings = ("\n" + closing, closing)
        self._lead = True  # nothing but whitespace seen yet
        self._after_opening = False  # the next character, if a newline, is the tag's
        self._after_closing = False  # whitespace held since a closing tag
        self._held = ""

    def feed(self, text: str) -> str:
        """What of `text` (and of what was held) is content now."""
        buf, self._held = self._held + text, ""
        if self._lead:
            head = buf.lstrip()
            if len(head) < len(self.opening) and self.opening.startswith(head):
                self._held = buf  # whitespace, or the opening tag begun
                return ""
            self._lead = False
            if head.startswith(self.opening):
                buf, self._after_opening = head[len(self.opening) :], True
        if self._after_opening and buf:
            buf, self._after_opening = buf.removeprefix("\n"), False
        out = []
        while True:
            at, tag = first_marker(buf, self.closings)
            if at < 0:
                break
            out.append(buf[:at])
            buf, self._after_closing = buf[at + len(tag) :], True
        if self._after_closing and buf:
            if not buf.strip():  # only whitespace since the tag: held, maybe the end's
                self._held = buf
                return "".join(out)
            self._after_closing = False
        keep = marker_tail(buf, self.closings)
        out.append(buf[: len(buf) - keep])
        self._held = buf[len(buf) - keep :]
        return "".join(out)

    def flush(self) -> str:
        """At the end of the answer: what was held, as content (whitespace after a closing
        tag dropped)."""
        held, self._held = self._held, ""
        return "" if self._after_closing and not held.strip() else held
