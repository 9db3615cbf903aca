"""Reasoning parsers (`troupe serve --reasoning-parser`, vLLM's and SGLang's flag): a reasoning
model's thinking, written between `<think>` and `</think>`, goes to the chat answer's
`reasoning_content` (DeepSeek's API field, which vLLM and SGLang also fill) and the rest to
`content`, whole or as a stream of deltas.

    deepseek_r1  the answer starts in thinking (R1's template opens `<think>` in the prompt, or
                 the model writes it first): everything up to `</think>` is reasoning; no
                 `</think>` at all means the answer was all thinking (cut off)
    qwen3        the answer thinks only if it opens `<think>` itself, or if the prompt left a
                 `<think>` open (Qwen3 thinking-only models' templates); with
                 `enable_thinking: false` the template closes an empty block in the prompt and
                 the answer is all content

The tags are matched in text, so a tag split over several deltas (or several tokens) is held
back until it is whole; nothing else is held.

Structured output (and tool calls, which are structured output) constrains only the content:
`constraint_reasoning` says where the thinking goes in the grammar (StructuredOutputs.
reasoning), so the model thinks freely and the content alone follows the schema.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import msgspec
from troupe.messages import Delta, Finished
from troupe.messages.structured import THINK_END, THINK_START, Reasoning

START, END = THINK_START, THINK_END  # the grammar's thinking block reads the same tags
ParserName = Literal["deepseek_r1", "qwen3"]
PARSERS: tuple[ParserName, ...] = ("deepseek_r1", "qwen3")


@dataclasses.dataclass(frozen=True, slots=True)
class Split:
    reasoning: str | None
    content: str | None


def opens_thinking(name: ParserName, prompt_text: str) -> bool:
    """Whether an answer to this prompt starts inside a thinking block."""
    if name == "deepseek_r1":
        return True
    return prompt_text.rfind(START) > prompt_text.rfind(END)


def constraint_reasoning(name: ParserName, prompt_text: str) -> Reasoning:
    """Where a structured answer's constraint starts: after a thinking block the answer starts
    in ("required"), after one it may open ("optional"), or at once, when the prompt closed an
    empty block (Qwen3's `enable_thinking: false`: the answer is all content)."""
    if opens_thinking(name, prompt_text):
        return "required"
    if prompt_text.rstrip().endswith(END):
        return "none"
    return "optional"


class ReasoningStream:
    """One answer's text, fed in deltas: each delta's reasoning and content parts."""

    def __init__(self, name: ParserName, prompt_text: str = "") -> None:
        self.name = name
        self.thinking = opens_thinking(name, prompt_text)
        self.may_open = not self.thinking  # qwen3: a `<think>` leading the answer opens it
        self.strip_start = name == "deepseek_r1"  # R1 may still write the `<think>` itself
        self._held = ""
        self._seen_any = False
        self.saw_end = False

    def feed(self, text: str) -> Split:
        """The parts of `text` (and of what was held) that are known now."""
        buf = self._held + text
        self._held = ""
        reasoning: list[str] = []
        content: list[str] = []
        while buf:
            if not self._seen_any:
                stripped = buf.lstrip()
                lead = START if (self.may_open or self.strip_start) else None
                if lead is not None and START.startswith(stripped) and stripped != START:
                    self._held = buf  # maybe the start of `<think>`
                    break
                self._seen_any = True
                if lead is not None and stripped.startswith(START):
                    buf = stripped[len(START) :]
                    self.thinking = True
                    continue
            if not self.thinking:
                content.append(buf)
                break
            at = buf.find(END)
            if at >= 0:
                reasoning.append(buf[:at])
                buf = buf[at + len(END) :]
                self.thinking, self.saw_end = False, True
                continue
            keep = _partial_suffix(buf, END)
            reasoning.append(buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            break
        return Split(_joined(reasoning), _joined(content))

    def flush(self) -> Split:
        """At the end of the answer: what was held back, as what it would have been."""
        held, self._held = self._held, ""
        if not held:
            return Split(None, None)
        return Split(held, None) if self.thinking else Split(None, held)


def split_whole(name: ParserName, text: str, prompt_text: str = "") -> Split:
    """A whole answer's reasoning and content (None where there is none)."""
    stream = ReasoningStream(name, prompt_text)
    first, last = stream.feed(text), stream.flush()
    reasoning = (first.reasoning or "") + (last.reasoning or "")
    content = (first.content or "") + (last.content or "")
    return Split(reasoning or None, content or None)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (a tag cut in two)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _joined(parts: list[str]) -> str | None:
    text = "".join(parts)
    return text or None


class ReasoningSplitter:
    """A chat answer's events (one stream per choice index): each Delta or Finished gives its
    reasoning text and comes back carrying only its content text (what tool-call parsing and
    the `content` field then see); a Finished flushes what its choice held back."""

    def __init__(self, name: ParserName, prompt_text: str) -> None:
        self.name = name
        self.prompt_text = prompt_text
        self._streams: dict[int, ReasoningStream] = {}

    def split(self, event: Delta | Finished) -> tuple[str, Delta | Finished]:
        stream = self._streams.get(event.index)
        if stream is None:
            stream = self._streams[event.index] = ReasoningStream(self.name, self.prompt_text)
        parts = [stream.feed(event.text)]
        if isinstance(event, Finished):
            parts.append(stream.flush())
        reasoning = "".join(p.reasoning or "" for p in parts)
        content = "".join(p.content or "" for p in parts)
        if content != event.text:
            event = msgspec.structs.replace(event, text=content)
        return reasoning, event
