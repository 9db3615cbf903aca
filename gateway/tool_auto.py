"""tool_choice "auto": the model decides, in its own tool-call format, parsed out of its text.

Supported: the Hermes format that Qwen2.5/Qwen3, Hermes and others define in their chat
templates (a template that mentions `<tool_call>`): the tools go into the prompt through the
template's `tools` variable, and each call comes back as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Text outside the tags is the message's content. A reply whose blocks do not all parse (bad
JSON, an unknown tool, a tag left open because max_tokens cut it) is plain text, as vLLM's
Hermes parser answers. `AutoToolStream` streams content as it comes, holding back from the
first `<tool_call>` (and any tail that could be its beginning), and the calls at the end (a
non-streamed Responses answer's items); streamed chat and Responses answers send each call as
it is written (`HermesReader`, read by gateway/tool_stream.py and gateway/responses_calls.py):
the name once its string closes, then the arguments' JSON as written.

`--tool-call-parser` (vLLM's flag) picks the format whatever the template: `hermes`,
`llama3_json` (Llama 3.x's bare JSON calls, gateway/tool_llama3.py), or one of the formats
read through gateway/tool_format.py: `mistral` (tool_mistral.py), `pythonic`
(tool_pythonic.py), `qwen3_coder` (tool_qwen3_coder.py), `deepseek_v3` and `deepseek_v31`
(tool_deepseek_v3.py),
`granite` (tool_granite.py), `kimi_k2` (tool_kimi_k2.py), `glm45` (tool_glm45.py),
`minimax_m2` (tool_minimax_m2.py), `seed_oss` (Seed-OSS's, Qwen3-Coder's calls in
`<seed:tool_call>`: tool_qwen3_coder.py), `hunyuan_a13b` (a JSON array in `<tool_calls>`:
tool_hunyuan.py), `openai` (GPT-OSS's harmony calls, tool_openai.py; it
needs the `openai_gptoss` reasoning parser, which keeps the calls in the content).
Unset, the format is the one the chat template writes its calls in (`template_tool_parser`):
Hermes for a template that mentions `<tool_call>`, unless the template writes another format
inside those tags (GLM-4.5's `<arg_key>`, Qwen3-Coder's `<function=`), or Seed-OSS's, Kimi K2's,
MiniMax-M2's, Hunyuan-A13B's or GPT-OSS's (with its reasoning parser) for a template that writes their
markers; "auto" is refused elsewhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol, get_args

from troupe.actors.core.marker_tail import marker_tail
from troupe.gateway.harmony import START as HARMONY_START
from troupe.gateway.json_scan import ObjectScan, object_call
from troupe.gateway.python_call_scan import PythonicReader
from troupe.gateway.tool_deepseek_v3 import DEEPSEEK_V3, DEEPSEEK_V31, DeepSeekV3Reader
from troupe.gateway.tool_format import CallFormat, FormatCallStream, ToolSchemas, parse_reply
from troupe.gateway.tool_glm45 import GLM45, KEY_OPEN, Glm45Reader
from troupe.gateway.tool_granite import GRANITE, GraniteReader
from troupe.gateway.tool_hunyuan import HUNYUAN, hunyuan_reader
from troupe.gateway.tool_hunyuan import OPEN as HUNYUAN_OPEN
from troupe.gateway.tool_kimi_k2 import KIMI_K2, SECTION_BEGIN, KimiK2Reader
from troupe.gateway.tool_llama3 import Llama3Reader, Llama3ToolStream, parse_llama3_calls
from troupe.gateway.tool_minimax_m2 import MINIMAX_M2, MiniMaxM2Reader
from troupe.gateway.tool_minimax_m2 import OPEN as MINIMAX_OPEN
from troupe.gateway.tool_mistral import MISTRAL, MistralReader
from troupe.gateway.tool_openai import OPENAI, OpenAIReader
from troupe.gateway.tool_pythonic import PYTHONIC
from troupe.gateway.tool_qwen3_coder import (
    FUNC_OPEN,
    QWEN3_CODER,
    SEED_OSS,
    SEED_WRAPPER,
    Qwen3CoderReader,
)
from troupe.gateway.tool_reader import CallReader, SectionSoFar, openai_call_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"
HARMONY_CALL = f"{HARMONY_START}assistant to="  # GPT-OSS's template, writing a call
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)

ToolParserName = Literal[
    "hermes",
    "llama3_json",
    "mistral",
    "pythonic",
    "qwen3_coder",
    "deepseek_v3",
    "deepseek_v31",
    "granite",
    "kimi_k2",
    "glm45",
    "minimax_m2",
    "seed_oss",
    "hunyuan_a13b",
    "openai",
]
TOOL_PARSERS: tuple[ToolParserName, ...] = get_args(ToolParserName)
_FORMATS: dict[str, CallFormat] = {
    "granite": GRANITE,
    "mistral": MISTRAL,
    "pythonic": PYTHONIC,
    "qwen3_coder": QWEN3_CODER,
    "deepseek_v3": DEEPSEEK_V3,
    "deepseek_v31": DEEPSEEK_V31,
    "kimi_k2": KIMI_K2,
    "glm45": GLM45,
    "minimax_m2": MINIMAX_M2,
    "seed_oss": SEED_OSS,
    "hunyuan_a13b": HUNYUAN,
    "openai": OPENAI,
}
# what a chat template writes when it renders a turn's calls, the most specific first: GLM's
# and Qwen3-Coder's calls sit inside Hermes's tags, Seed-OSS's functions in its own
_TEMPLATE_MARKERS: tuple[tuple[str, ToolParserName], ...] = (
    (SEED_WRAPPER[0], "seed_oss"),
    (KEY_OPEN, "glm45"),
    (FUNC_OPEN, "qwen3_coder"),
    (SECTION_BEGIN, "kimi_k2"),
    (MINIMAX_OPEN, "minimax_m2"),
    (HARMONY_CALL, "openai"),
    (HUNYUAN_OPEN, "hunyuan_a13b"),
    (OPEN, "hermes"),
)


class AutoCallStream(Protocol):
    """One streamed "auto" reply, in some format: content to send now, the calls at the end.
    `held_from`: where the held call section begins (None: no section yet)."""

    text: str

    @property
    def held_from(self) -> int | None: ...

    def delta(self, piece: str) -> str: ...

    def finish(self, stopped: bool) -> tuple[str, list[dict[str, Any]]]: ...


def auto_tool_parser(
    setting: ToolParserName | None, reasoning: str | None, template: str | None
) -> ToolParserName | None:
    """The format "auto" replies are parsed in (None: "auto" is refused): the server's
    `tool_call_parser`, else the one the chat template writes (GPT-OSS's only where the
    server's `reasoning` parser reads harmony, openai_gptoss)."""
    if setting is not None:
        return setting
    found = template_tool_parser(template)
    return None if found == "openai" and reasoning != "openai_gptoss" else found


def parse_auto_calls(
    text: str, tools: Sequence[dict[str, Any]], parser: ToolParserName
) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI `tool_calls`) of a whole reply in `parser`'s format; `tools`: the
    request's, as sent (ToolPlan.tools)."""
    names = [t["function"]["name"] for t in tools]
    if parser == "llama3_json":
        return parse_llama3_calls(text, names)
    if parser == "hermes":
        return parse_calls(text, names)
    return parse_reply(_FORMATS[parser], text, ToolSchemas(tuple(tools)))


def auto_tool_stream(tools: Sequence[dict[str, Any]], parser: ToolParserName) -> AutoCallStream:
    """A streamed reply's reader in `parser`'s format; `tools` as parse_auto_calls's."""
    names = [t["function"]["name"] for t in tools]
    if parser == "llama3_json":
        return Llama3ToolStream(names)
    if parser == "hermes":
        return AutoToolStream(names)
    return FormatCallStream(_FORMATS[parser], tools)


def auto_call_reader(tools: Sequence[dict[str, Any]], parser: ToolParserName) -> CallReader:
    """What reads `parser`'s calls as they are written (gateway/tool_stream.py)."""
    if parser == "hermes":
        return HermesReader()
    if parser == "llama3_json":
        return Llama3Reader()
    if parser == "mistral":
        return MistralReader()
    if parser == "pythonic":
        return PythonicReader()
    if parser == "qwen3_coder":
        return Qwen3CoderReader(ToolSchemas(tuple(tools)))
    if parser == "seed_oss":
        return Qwen3CoderReader(ToolSchemas(tuple(tools)), SEED_WRAPPER)
    if parser == "granite":
        return GraniteReader()
    if parser == "kimi_k2":
        return KimiK2Reader()
    if parser == "glm45":
        return Glm45Reader(ToolSchemas(tuple(tools)))
    if parser == "minimax_m2":
        return MiniMaxM2Reader(ToolSchemas(tuple(tools)))
    if parser == "openai":
        return OpenAIReader()
    if parser == "hunyuan_a13b":
        return hunyuan_reader()
    return DeepSeekV3Reader(fenced=parser == "deepseek_v3")


def template_tool_parser(template: str | None) -> ToolParserName | None:
    """The tool-call format a chat template writes its calls in (None: none troupe reads)."""
    if template is None:
        return None
    return next((name for marker, name in _TEMPLATE_MARKERS if marker in template), None)


def parse_calls(text: str, names: Iterable[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI `tool_calls`) of a reply; no calls: the whole text is the content."""
    if OPEN not in text:
        return text, []
    known = set(names)
    calls = []
    for block in _BLOCK.findall(text):
        try:
            call = json.loads(block)
        except ValueError:
            return text, []
        if not isinstance(call, dict) or call.get("name") not in known:
            return text, []
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            {
                "id": openai_call_id(),
                "type": "function",
                "function": {"name": call["name"], "arguments": arguments},
            }
        )
    rest = _BLOCK.sub("", text)
    if not calls or OPEN in rest:  # a tag left open: cut short
        return text, []
    return (rest.strip() or None), calls


class AutoToolStream:
    """One streamed reply: content to send now, and at the end the calls (or the rest)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self.text = ""
        self._sent = 0  # text[:_sent] went out as content
        self._holding = False  # a <tool_call> began: the rest waits for the end

    @property
    def held_from(self) -> int | None:
        return self._sent if self._holding else None

    def delta(self, piece: str) -> str:
        """The content of `piece` that can go out now."""
        self.text += piece
        if self._holding:
            return ""
        at = self.text.find(OPEN, self._sent)
        if at >= 0:
            self._holding = True
            end = at
        else:  # keep back a tail that may be the tag's beginning
            end = len(self.text) - _tag_prefix(self.text)
        out, self._sent = self.text[self._sent : end], end
        return out

    def finish(self, stopped: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content not sent yet, calls): the calls only when the reply ended by itself."""
        rest = self.text[self._sent :]
        if not stopped or not self._holding:
            return rest, []
        content, calls = parse_calls(rest, self.names)
        if not calls:
            return rest, []
        return content or "", calls


def _tag_prefix(text: str) -> int:
    """Length of the longest tail of `text` that begins `<tool_call>`."""
    return marker_tail(text, (OPEN,))


class HermesReader:
    """Hermes blocks read as they are written (a tool_reader.CallReader): each block's JSON
    object as a call, and the text between and after blocks (outside `<tool_call>` ...
    `</tool_call>`, as the whole parse's `_BLOCK` cuts them) as content."""

    def __init__(self) -> None:
        self._scans: dict[int, ObjectScan] = {}  # by where a block's body begins

    def call_id(self) -> str:
        return openai_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        calls, outside = [], []
        at = start  # a <tool_call> begins here
        while at >= 0:
            body = at + len(OPEN)
            close = text.find(CLOSE, body)
            limit = close if close >= 0 else len(text) - marker_tail(text, (CLOSE,), body)
            scan = self._scans.setdefault(body, ObjectScan(body))
            calls.append(object_call(text, scan, limit))
            if close < 0:
                break
            after = close + len(CLOSE)
            at = text.find(OPEN, after)
            end = at if at >= 0 else len(text)
            if at < 0 and not is_final:
                end -= marker_tail(text, (OPEN,), after)
            outside.append(text[after:end])
        return SectionSoFar(tuple(calls), "".join(outside).rstrip())
