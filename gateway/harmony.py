"""GPT-OSS's harmony answers (`--reasoning-parser openai_gptoss`): an answer is a run of
messages, each a header then a body,

    <|channel|>analysis<|message|>...thinking...<|end|>
    <|start|>assistant<|channel|>final<|message|>...the answer...<|return|>

(a header may name a recipient and a format: `<|channel|>commentary to=functions.f
<|constrain|>json<|message|>`; a body ends at <|end|>, <|return|> or <|call|>). The analysis
channel's bodies are the answer's reasoning (`reasoning_content`), every other channel's
(final, commentary) its content; headers and markers are dropped, and text outside any message
(a model that skips the format) is content. The markers are special tokens, so the request
runs with skip_special_tokens off (gateway/chat_reasoning.py). A marker split over several
deltas is held back until it is whole, as gateway/reasoning.py holds its tags.
"""

from __future__ import annotations

from troupe.actors.core.marker_tail import marker_tail
from troupe.gateway.reasoning_split import Split, joined

START, CHANNEL, CONSTRAIN, MESSAGE = "<|start|>", "<|channel|>", "<|constrain|>", "<|message|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>")
MARKERS = (START, CHANNEL, CONSTRAIN, MESSAGE, *ENDS)
THINKING_CHANNEL = "analysis"


class HarmonyStream:
    """One answer's text, fed in deltas: each delta's reasoning and content parts (the
    interface of gateway/reasoning.ReasoningStream)."""

    def __init__(self) -> None:
        self._held = ""
        self._in_body = False
        self._naming: str | None = None  # the header marker whose text follows (a role, ...)
        self._channel = ""

    def feed(self, text: str) -> Split:
        """The parts of `text` (and of what was held) that are known now."""
        buf = self._held + text
        self._held = ""
        reasoning: list[str] = []
        content: list[str] = []
        while buf:
            at = min((i for m in MARKERS if (i := buf.find(m)) >= 0), default=-1)
            if at < 0:
                keep = marker_tail(buf, MARKERS)
                if not self._in_body and self._naming == CHANNEL:
                    keep = len(buf)  # the channel's name may go on
                self._text(buf[: len(buf) - keep], reasoning, content)
                self._held = buf[len(buf) - keep :]
                break
            self._text(buf[:at], reasoning, content)
            marker = next(m for m in MARKERS if buf.startswith(m, at))
            self._marker(marker)
            buf = buf[at + len(marker) :]
        return Split(joined(reasoning), joined(content))

    def flush(self) -> Split:
        """At the end of the answer: what was held back, as what it would have been."""
        held, self._held = self._held, ""
        reasoning: list[str] = []
        content: list[str] = []
        self._text(held, reasoning, content)
        return Split(joined(reasoning), joined(content))

    def _text(self, text: str, reasoning: list[str], content: list[str]) -> None:
        if not text:
            return
        if self._in_body:
            (reasoning if self._channel == THINKING_CHANNEL else content).append(text)
        elif self._naming == CHANNEL:
            self._channel += text
        elif self._naming is None:  # outside any message
            content.append(text)

    def _marker(self, marker: str) -> None:
        if marker == MESSAGE:
            self._in_body, self._naming = True, None
            words = self._channel.split()
            self._channel = words[0] if words else ""
        elif marker in ENDS:
            self._in_body, self._naming = False, None
        else:  # a header marker (one in a body ends that body too)
            self._in_body, self._naming = False, marker
            if marker == CHANNEL:
                self._channel = ""
