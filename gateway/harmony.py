"""GPT-OSS's harmony answers (`--reasoning-parser openai_gptoss`): an answer is a run of
messages, each a header then a body,

    <|channel|>analysis<|message|>...thinking...<|end|>
    <|start|>assistant<|channel|>final<|message|>...the answer...<|return|>

(a header may name a recipient and a format: `<|channel|>commentary to=functions.f
<|constrain|>json<|message|>`, or, as GPT-OSS's chat template writes calls, `<|start|>assistant
to=functions.f<|channel|>commentary json<|message|>`; a body ends at <|end|>, <|return|>,
<|call|> or the next header). Where a body goes (vLLM's reading):

    analysis channel                reasoning (`reasoning_content`)
    a call (to=functions.NAME)      with `keeps_calls`, content written as the chat template
                                    writes a call (below), for the `openai` tool-call parser
                                    (gateway/tool_openai.py); else dropped
    another recipient               dropped (a built-in tool's input: browser, python)
    any other channel               content (final; commentary without a recipient, the
                                    preambles before calls)

    a kept call    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>
                   {"city": "Paris"}<|call|>

Headers and markers are dropped, and text outside any message (a model that skips the format)
is content; an answer may go on its prompt's `<|start|>assistant` header (` to=functions.f
<|channel|>...`). The markers are special tokens, so the request runs with
skip_special_tokens off (gateway/chat_reasoning.py). A marker split over several deltas is held
back until it is whole, as gateway/reasoning.py holds its tags, and so is a header until its
`<|message|>`.
"""

from __future__ import annotations

from typing import Literal

from troupe.actors.core.marker_tail import marker_tail
from troupe.gateway.reasoning_split import Split, joined
from troupe.messages.structured import (
    HARMONY_CALL,
    HARMONY_CHANNEL,
    HARMONY_CONSTRAIN,
    HARMONY_ENDS,
    HARMONY_MARKERS,
    HARMONY_MESSAGE,
    HARMONY_START,
)

START, CHANNEL, CONSTRAIN, MESSAGE = (
    HARMONY_START,
    HARMONY_CHANNEL,
    HARMONY_CONSTRAIN,
    HARMONY_MESSAGE,
)
ENDS, MARKERS, CALL_END = HARMONY_ENDS, HARMONY_MARKERS, HARMONY_CALL
THINKING_CHANNEL = "analysis"
RECIPIENT, FUNCTIONS = "to=", "functions."
CALL_OPEN = f"{START}assistant {RECIPIENT}{FUNCTIONS}"  # a kept call, as the template writes it

Route = Literal["reasoning", "content", "call", "drop"]


class HarmonyStream:
    """One answer's text, fed in deltas: each delta's reasoning and content parts (the
    interface of gateway/reasoning.ReasoningStream). `keeps_calls`: function calls stay in the
    content, written as the chat template writes them."""

    def __init__(self, *, keeps_calls: bool = False) -> None:
        self.keeps_calls = keeps_calls
        self._held = ""
        self._lead = True  # nothing read yet: the answer may go on its prompt's header
        self._naming: str | None = None  # in a header: the marker whose text follows
        self._header: dict[str, str] = {}  # the header's text after each of its markers
        self._body: Route | None = None  # in a body: where its text goes

    def feed(self, text: str) -> Split:
        """The parts of `text` (and of what was held) that are known now."""
        buf = self._held + text
        self._held = ""
        out: dict[Route, list[str]] = {"reasoning": [], "content": []}
        while buf:
            if self._lead:
                head = buf.lstrip()
                if RECIPIENT.startswith(head):  # blank, or maybe the start of `to=`
                    self._held = buf
                    break
                self._lead = False
                if head.startswith(RECIPIENT):  # the prompt's `<|start|>assistant` goes on
                    self._naming, self._header = START, {START: ""}
            at = min((i for m in MARKERS if (i := buf.find(m)) >= 0), default=-1)
            if at < 0:
                keep = marker_tail(buf, MARKERS)
                if self._naming is not None:
                    keep = len(buf)  # a header is read whole at its <|message|>
                self._text(buf[: len(buf) - keep], out)
                self._held = buf[len(buf) - keep :]
                break
            self._text(buf[:at], out)
            marker = next(m for m in MARKERS if buf.startswith(m, at))
            self._marker(marker, out)
            buf = buf[at + len(marker) :]
        return Split(joined(out["reasoning"]), joined(out["content"]))

    def flush(self) -> Split:
        """At the end of the answer: what was held back, as what it would have been (a header
        never finished is dropped; a kept call still open is closed)."""
        held, self._held = self._held, ""
        out: dict[Route, list[str]] = {"reasoning": [], "content": []}
        if self._naming is None:
            self._text(held, out)
        self._end_body(out)
        return Split(joined(out["reasoning"]), joined(out["content"]))

    def _text(self, text: str, out: dict[Route, list[str]]) -> None:
        if not text:
            return
        if self._naming is not None:
            self._header[self._naming] += text
        elif self._body is None:  # outside any message
            out["content"].append(text)
        elif self._body != "drop":
            out["content" if self._body == "call" else self._body].append(text)

    def _marker(self, marker: str, out: dict[Route, list[str]]) -> None:
        if marker == MESSAGE:
            self._naming = None
            self._body = self._route(out)
            return
        self._end_body(out)
        if marker in ENDS:
            self._naming = None
            return
        if marker == START or self._naming is None:  # a new header
            self._header = {}
        self._naming = marker
        self._header[marker] = self._header.get(marker, "")

    def _route(self, out: dict[Route, list[str]]) -> Route:
        """Where the body of the header just read goes (a kept call's header is written)."""
        words = self._header.get(CHANNEL, "").split()
        channel = words[0] if words else ""
        said = f"{self._header.get(START, '')} {self._header.get(CHANNEL, '')}".split()
        recipient = next((w[len(RECIPIENT) :] for w in said if w.startswith(RECIPIENT)), None)
        self._header = {}
        if recipient is not None and recipient.startswith(FUNCTIONS):
            if not self.keeps_calls:
                return "drop"
            name = recipient[len(FUNCTIONS) :]
            out["content"].append(f"{CALL_OPEN}{name}{CHANNEL}commentary json{MESSAGE}")
            return "call"
        if channel == THINKING_CHANNEL:
            return "reasoning"
        return "drop" if recipient is not None else "content"

    def _end_body(self, out: dict[Route, list[str]]) -> None:
        if self._body == "call":
            out["content"].append(CALL_END)
        self._body = None
