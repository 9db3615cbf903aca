"""tool_choice "auto" for DeepSeek-V3 / R1-0528 (vLLM's `--tool-call-parser deepseek_v3`):

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Text before `<｜tool▁calls▁begin｜>` is the content; what follows the calls is dropped, as vLLM
does. Each call must be a known tool's with a JSON object of arguments (passed on as the model
wrote them, as vLLM's are), or the reply is text. vLLM's pattern does not let arguments span
lines; troupe's does, since DeepSeek pretty-prints large ones. Ids are vLLM's
(`chatcmpl-tool-` and 32 hex digits). Streamed (`DeepSeekV3Reader`), a call opens once its
name's fence is written and its JSON object goes out as written.
"""

from __future__ import annotations

import json

from troupe.gateway.json_scan import ObjectScan
from troupe.gateway.tool_format import (
    CallFormat,
    ToolCallDict,
    ToolSchemas,
    make_call,
    vllm_call_id,
)
from troupe.gateway.tool_reader import CallSoFar, SectionSoFar

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE_OPEN, _FENCE_CLOSE = "\n```json\n", "\n```"


def parse_deepseek_v3(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a section that starts with `<｜tool▁calls▁begin｜>`."""
    calls = []
    at = section.find(CALL_BEGIN)
    while at >= 0:
        end = section.find(CALL_END, at)
        if end < 0:
            return None
        call = _call(section[at + len(CALL_BEGIN) : end], tools)
        if call is None:
            return None
        calls.append(call)
        at = section.find(CALL_BEGIN, end)
    return calls or None


def _call(inner: str, tools: ToolSchemas) -> ToolCallDict | None:
    """`function<｜tool▁sep｜>name` + the fenced JSON arguments, as one call."""
    kind, sep, rest = inner.partition(SEP)
    name, fence, arguments = rest.partition(_FENCE_OPEN)
    if not sep or kind.strip() != "function" or not fence or name not in tools.names:
        return None
    if not arguments.endswith(_FENCE_CLOSE):
        return None
    arguments = arguments.removesuffix(_FENCE_CLOSE)
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return make_call(vllm_call_id(), name, arguments)


DEEPSEEK_V3 = CallFormat((CALLS_BEGIN,), parse_deepseek_v3)


class DeepSeekV3Reader:
    """DeepSeek-V3's calls read as they are written (a tool_reader.CallReader)."""

    def __init__(self) -> None:
        self._scans: dict[int, ObjectScan] = {}  # by where a call's arguments begin

    def call_id(self) -> str:
        return vllm_call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        calls = []
        at = text.find(CALL_BEGIN, start)
        while at >= 0:
            end = text.find(CALL_END, at)
            calls.append(self._call(text, at + len(CALL_BEGIN), end if end >= 0 else len(text)))
            if end < 0:
                break
            at = text.find(CALL_BEGIN, end)
        return SectionSoFar(tuple(calls))

    def _call(self, text: str, inner: int, end: int) -> CallSoFar:
        sep = text.find(SEP, inner, end)
        fence = text.find(_FENCE_OPEN, sep + len(SEP), end) if sep >= 0 else -1
        if fence < 0 or text[inner:sep].strip() != "function":
            return CallSoFar(None)
        body = fence + len(_FENCE_OPEN)
        scan = self._scans.setdefault(body, ObjectScan(body))
        scan.advance(text, end)
        return CallSoFar(text[sep + len(SEP) : fence], scan.object_so_far(text, end))
