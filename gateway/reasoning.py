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

    minimax_m2   MiniMax-M2, whose template opens `<think>` in the prompt: read as deepseek_r1
    glm45        GLM-4.5/4.6's hybrid, read as qwen3 reads answers: it writes `<think>` when it
                 thinks, and with `enable_thinking: false` its template closes an empty block
                 in the prompt
    deepseek_v3  DeepSeek V3.1's hybrid: thinks only when the prompt left `<think>` open (its
                 template's `thinking: true`), else all content (as qwen3 reads it)
    apertus      Apertus's `<|inner_prefix|>`...`<|inner_suffix|>` (special tokens, so its requests
                 keep special tokens in their text), read as qwen3 reads `<think>`
    olmo3        OLMo 3 Think, read as qwen3 (its template may open `<think>` in the prompt)
    exaone4      EXAONE 4.0, read as deepseek_v3: its template opens `<think>` in the prompt
                 when `enable_thinking` is true, and the answer is all content otherwise
    mistral      Magistral's `[THINK]`...`[/THINK]`: the answer is content until its first
                 `[THINK]` (wherever it comes), thinking to `[/THINK]`, content again after; a
                 `[/THINK]` before any `[THINK]` is dropped
    seed_oss     Seed-OSS's `<seed:think>`...`</seed:think>`: the answer thinks when it opens
                 with the tag (as the model does; its budget reflections stay in the thinking),
                 content after the closing one
    ernie45      ERNIE 4.5 Thinking (21B-A3B): read as deepseek_r1 (its answers start thinking),
                 then `<response>`...`</response>` around the content taken away
                 (gateway/answer_tags.py), as vLLM's ernie45 parser does
    hunyuan_a13b  Hunyuan-A13B's `<think>\n`...`\n</think>`, read as qwen3 reads answers, then
                 `<answer>\n`...`\n</answer>`: the content without those tags
                 (gateway/answer_tags.py)
    openai_gptoss  GPT-OSS's harmony messages: the analysis channel is the thinking, the
                 other channels the content, calls to functions kept for the `openai`
                 tool-call parser or dropped (gateway/harmony.py)
    granite      IBM Granite 3.2's prose markers: an answer that opens with "Here is my thought
                 process:" (or "Here's") thinks until "Here is my response:" (or "Here's");
                 vLLM's whole-answer parser also finds them later in the answer and calls an
                 answer with no response marker all content, but its streamed one does not;
                 troupe keeps the streamed rule for both, so the two agree

The tags are matched in text, so a tag split over several deltas (or several tokens) is held
back until it is whole; nothing else is held (but what gateway/answer_tags.py holds of an
answer's own tags).

Structured output (and tool calls, which are structured output) constrains only the content:
`constraint_reasoning` says where the thinking goes in the grammar (StructuredOutputs.
reasoning), so the model thinks freely and the content alone follows the schema. The grammar
writes the thinking between `<think>` tags, so the parsers with other tags or with tags
around the answer (mistral, granite, seed_oss, apertus, hunyuan_a13b, ernie45) constrain a
structured answer from its first token (no thinking); openai_gptoss's, the final channel's
body after any analysis messages (StructuredOutputs.reasoning "harmony").
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

import msgspec
from troupe.actors.core.marker_tail import first_marker, marker_tail
from troupe.gateway.answer_tags import AnswerTags
from troupe.gateway.harmony import HarmonyStream
from troupe.gateway.reasoning_split import Split, joined
from troupe.messages import Delta, Finished
from troupe.messages.structured import THINK_END, THINK_START, Reasoning

START, END = THINK_START, THINK_END  # the grammar's thinking block reads the same tags
ParserName = Literal[
    "deepseek_r1",
    "qwen3",
    "deepseek_v3",
    "mistral",
    "granite",
    "glm45",
    "minimax_m2",
    "seed_oss",
    "hunyuan_a13b",
    "ernie45",
    "exaone4",
    "apertus",
    "olmo3",
    "openai_gptoss",
]
PARSERS: tuple[ParserName, ...] = get_args(ParserName)
STARTS_THINKING: tuple[ParserName, ...] = ("deepseek_r1", "minimax_m2", "ernie45")  # any prompt
# the prompt says
PROMPT_DECIDES: tuple[ParserName, ...] = (
    "qwen3", "deepseek_v3", "glm45", "hunyuan_a13b", "exaone4", "apertus", "olmo3",
)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class ThinkTags:
    """A parser's tags: any of `starts` opens thinking, any of `ends` closes it."""

    starts: tuple[str, ...]
    ends: tuple[str, ...]
    opens_anywhere: bool = False  # else only a start that leads the answer opens
    drops_stray_end: bool = False  # an end before any start is removed from the content
    answer: tuple[str, str] | None = None  # tags around the content, removed (answer_tags.py)
    special: bool = False  # the tags are special tokens: kept in the text (chat_reasoning.py)


_THINK = ThinkTags((START,), (END,))
TAGS: dict[ParserName, ThinkTags] = {
    "deepseek_r1": _THINK,
    "qwen3": _THINK,
    "deepseek_v3": _THINK,
    "mistral": ThinkTags(("[THINK]",), ("[/THINK]",), opens_anywhere=True, drops_stray_end=True),
    "granite": ThinkTags(
        ("Here is my thought process:", "Here's my thought process:"),
        ("Here is my response:", "Here's my response:"),
    ),
    "glm45": _THINK,
    "exaone4": _THINK,
    "olmo3": _THINK,
    "minimax_m2": _THINK,
    "seed_oss": ThinkTags(("<seed:think>",), ("</seed:think>",)),
    # the first of each as Hunyuan writes them, newlines and all (its tokens end in ">\n"), so
    # that a thinking budget finds and forces the tokens it draws
    "hunyuan_a13b": ThinkTags(
        ("<think>\n", START), ("\n</think>\n", "\n" + END, END), answer=("<answer>", "</answer>")
    ),
    "ernie45": ThinkTags((START,), (END,), answer=("<response>", "</response>")),
    "apertus": ThinkTags(("<|inner_prefix|>",), ("<|inner_suffix|>",), special=True),
}


def opens_thinking(name: ParserName, prompt_text: str) -> bool:
    """Whether an answer to this prompt starts inside a thinking block."""
    if name in STARTS_THINKING:
        return True
    if name not in PROMPT_DECIDES:
        return False
    tags = TAGS[name]
    last_start = max(prompt_text.rfind(tag) for tag in tags.starts)
    return last_start > max(prompt_text.rfind(tag) for tag in tags.ends)


def constraint_reasoning(name: ParserName, prompt_text: str) -> Reasoning:
    """Where a structured answer's constraint starts: after a thinking block the answer starts
    in ("required"), after one it may open ("optional"), or at once, when the prompt closed an
    empty block (Qwen3's `enable_thinking: false`: the answer is all content) or the parser's
    tags are not the grammar's `<think>`; GPT-OSS's: after its analysis messages ("harmony")."""
    if name == "openai_gptoss":
        return "harmony"
    if TAGS.get(name) is not _THINK:
        return "none"
    if opens_thinking(name, prompt_text):
        return "required"
    if prompt_text.rstrip().endswith(END):
        return "none"
    return "optional"


def reasoning_stream(
    name: ParserName, prompt_text: str = "", *, keeps_calls: bool = False
) -> ReasoningStream | HarmonyStream:
    """The stream that splits one answer of parser `name` (`keeps_calls`: HarmonyStream's)."""
    if name == "openai_gptoss":
        return HarmonyStream(keeps_calls=keeps_calls)
    return ReasoningStream(name, prompt_text)


class ReasoningStream:
    """One answer's text, fed in deltas: each delta's reasoning and content parts."""

    def __init__(self, name: ParserName, prompt_text: str = "") -> None:
        self.name = name
        self.tags = TAGS[name]
        self.thinking = opens_thinking(name, prompt_text)
        # a start leading the answer opens thinking (deepseek_r1: R1 may still write the
        # `<think>` its prompt opened; it is dropped); mistral's opens anywhere (_content)
        is_lead = name in STARTS_THINKING or not self.thinking
        self.lead_opens = is_lead and not self.tags.opens_anywhere
        self._held = ""
        self._seen_any = False
        self._opened = False  # mistral: only the first start opens
        self.saw_end = False
        answer = self.tags.answer
        self._answer = None if answer is None else AnswerTags(*answer)

    def feed(self, text: str) -> Split:
        """The parts of `text` (and of what was held) that are known now."""
        buf = self._held + text
        self._held = ""
        reasoning: list[str] = []
        content: list[str] = []
        starts, ends = self.tags.starts, self.tags.ends
        while buf:
            if not self._seen_any:
                stripped = buf.lstrip()
                if self.lead_opens and any(
                    s.startswith(stripped) and len(s) > len(stripped) for s in starts
                ):
                    self._held = buf  # maybe the start of a start tag
                    break
                self._seen_any = True
                lead = next((s for s in starts if stripped.startswith(s)), None)
                if self.lead_opens and lead is not None:
                    buf = stripped[len(lead) :]
                    self.thinking = self._opened = True
                    continue
            if not self.thinking:
                buf = self._content(buf, content)
                continue
            at, tag = first_marker(buf, ends)
            if at >= 0:
                reasoning.append(buf[:at])
                buf = buf[at + len(tag) :]
                self.thinking, self.saw_end = False, True
                continue
            keep = marker_tail(buf, ends)
            reasoning.append(buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            break
        if self._answer is not None:
            content = [self._answer.feed("".join(content))]
        return Split(joined(reasoning), joined(content))

    def _content(self, buf: str, content: list[str]) -> str:
        """Take content from `buf`; the rest (after a start that opens thinking) or ""."""
        if not self.tags.opens_anywhere or self._opened:
            content.append(buf)
            return ""
        stray_ends = self.tags.ends if self.tags.drops_stray_end and not self.saw_end else ()
        tags = self.tags.starts + stray_ends
        at, tag = first_marker(buf, tags)
        if at < 0:
            keep = marker_tail(buf, tags)
            content.append(buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            return ""
        content.append(buf[:at])
        if tag in self.tags.ends:  # a stray end, dropped (once)
            self.saw_end = True
        else:
            self.thinking = self._opened = True
        return buf[at + len(tag) :]

    def flush(self) -> Split:
        """At the end of the answer: what was held back, as what it would have been."""
        held, self._held = self._held, ""
        reasoning, content = (held, "") if self.thinking else (None, held)
        if self._answer is not None:
            content = self._answer.feed(content) + self._answer.flush()
        return Split(reasoning or None, content or None)


def split_whole(name: ParserName, text: str, prompt_text: str = "") -> Split:
    """A whole answer's reasoning and content (None where there is none)."""
    stream = reasoning_stream(name, prompt_text)
    first, last = stream.feed(text), stream.flush()
    reasoning = (first.reasoning or "") + (last.reasoning or "")
    content = (first.content or "") + (last.content or "")
    return Split(reasoning or None, content or None)


class ReasoningSplitter:
    """A chat answer's events (one stream per choice index): each Delta or Finished gives its
    reasoning text and comes back carrying only its content text (what tool-call parsing and
    the `content` field then see); a Finished flushes what its choice held back."""

    def __init__(self, name: ParserName, prompt_text: str, *, keeps_calls: bool = False) -> None:
        self.name = name
        self.prompt_text = prompt_text
        self.keeps_calls = keeps_calls  # GPT-OSS's "auto" calls stay in the content
        self._streams: dict[int, ReasoningStream | HarmonyStream] = {}

    def split(self, event: Delta | Finished) -> tuple[str, Delta | Finished]:
        stream = self._streams.get(event.index)
        if stream is None:
            stream = self._streams[event.index] = reasoning_stream(
                self.name, self.prompt_text, keeps_calls=self.keeps_calls
            )
        parts = [stream.feed(event.text)]
        if isinstance(event, Finished):
            parts.append(stream.flush())
        reasoning = "".join(p.reasoning or "" for p in parts)
        content = "".join(p.content or "" for p in parts)
        if content != event.text:
            event = msgspec.structs.replace(event, text=content)
        return reasoning, event
