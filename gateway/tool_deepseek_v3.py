"""tool_choice "auto" for DeepSeek-V3 / R1-0528 (vLLM's `--tool-call-parser deepseek_v3`):

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

and for DeepSeek-V3.1 / V3.2 (`--tool-call-parser deepseek_v31`), whose calls drop the kind
and the fence:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>

Text before `<｜tool▁calls▁begin｜>` is the content; what follows the calls is dropped, as vLLM
does. Each call must be a known tool's with a JSON object of arguments (passed on as the model
wrote them, as vLLM's are), or the reply is text. vLLM's pattern does not let arguments span
lines; troupe's does, since DeepSeek pretty-prints large ones. Ids are vLLM's
(`chatcmpl-tool-` and 32 hex digits). Streamed (`DeepSeekV3Reader`), a call opens once its
name is whole (V3: its fence written; V3.1: the separator after it) and its JSON object goes
out as written.
"""

from __future__ import annotations

from troupe.gateway.tool_format import (
    CallFormat,
    TaggedObjectReader,
    ToolCallDict,
    ToolSchemas,
    delimited_calls,
    json_object_call,
    vllm_call_id,
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE_OPEN, _FENCE_CLOSE = "\n```json\n", "\n```"


def parse_deepseek_v3(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a V3 section (it starts with `<｜tool▁calls▁begin｜>`)."""
    return _section(section, tools, fenced=True)


def parse_deepseek_v31(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a V3.1 section."""
    return _section(section, tools, fenced=False)


def _section(section: str, tools: ToolSchemas, *, fenced: bool) -> list[ToolCallDict] | None:
    parse_one = _fenced_call if fenced else _plain_call
    return delimited_calls(section, CALL_BEGIN, CALL_END, lambda inner: parse_one(inner, tools))


def _fenced_call(inner: str, tools: ToolSchemas) -> ToolCallDict | None:
    """`function<｜tool▁sep｜>name` + the fenced JSON arguments, as one call."""
    kind, sep, rest = inner.partition(SEP)
    name, fence, arguments = rest.partition(_FENCE_OPEN)
    if not sep or kind.strip() != "function" or not fence:
        return None
    if not arguments.endswith(_FENCE_CLOSE):
        return None
    return json_object_call(vllm_call_id(), name, arguments.removesuffix(_FENCE_CLOSE), tools)


def _plain_call(inner: str, tools: ToolSchemas) -> ToolCallDict | None:
    """`name<｜tool▁sep｜>{...}`, as one call."""
    name, sep, arguments = inner.partition(SEP)
    return json_object_call(vllm_call_id(), name, arguments.strip(), tools) if sep else None


DEEPSEEK_V3 = CallFormat((CALLS_BEGIN,), parse_deepseek_v3)
DEEPSEEK_V31 = CallFormat((CALLS_BEGIN,), parse_deepseek_v31)


class DeepSeekV3Reader(TaggedObjectReader):
    """DeepSeek-V3's calls (V3.1's: `fenced` False) read as they are written (a
    tool_reader.CallReader)."""

    open_tag, close_tag = CALL_BEGIN, CALL_END

    def __init__(self, *, fenced: bool = True) -> None:
        super().__init__()
        self._fenced = fenced

    def head(self, text: str, inner: int, end: int) -> tuple[str, int, str | None] | None:
        sep = text.find(SEP, inner, end)
        if sep < 0:
            return None
        if not self._fenced:
            return text[inner:sep], sep + len(SEP), None
        fence = text.find(_FENCE_OPEN, sep + len(SEP), end)
        if fence < 0 or text[inner:sep].strip() != "function":
            return None
        return text[sep + len(SEP) : fence], fence + len(_FENCE_OPEN), None
