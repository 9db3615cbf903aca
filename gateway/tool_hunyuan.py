"""tool_choice "auto" for Hunyuan-A13B (vLLM's `--tool-call-parser hunyuan_a13b`): its calls
are one JSON array between `<tool_calls>` tags, in the answer that gateway/reasoning.py's
hunyuan_a13b parser leaves once it has taken the thinking and the `<answer>` tags away:

    Let me look.<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_calls>

Text before the tag is content. The tags must close with nothing after them, and the array
follows Granite's rules (gateway/tool_granite.py): each call names a known tool with an object
of arguments (or none), or the reply is its text. Streamed (GraniteReader on this tag), each
object of the array goes out as it is written.
"""

from __future__ import annotations

from troupe.gateway.tool_format import CallFormat, ToolCallDict, ToolSchemas
from troupe.gateway.tool_granite import GraniteReader, parse_granite

OPEN, CLOSE = "<tool_calls>", "</tool_calls>"


def parse_hunyuan(section: str, tools: ToolSchemas) -> list[ToolCallDict] | None:
    """The calls of a section that opens with `<tool_calls>`; None if it is not calls."""
    body = section.strip()
    if not body.startswith(OPEN) or not body.endswith(CLOSE):
        return None
    return parse_granite(body[len(OPEN) : -len(CLOSE)], tools)


HUNYUAN = CallFormat((OPEN,), parse_hunyuan)


def hunyuan_reader() -> GraniteReader:
    """The array read as it is written, after the tag."""
    return GraniteReader((OPEN,))
