"""A streamed Responses answer's "auto" calls, as they are written: chat's StreamedCalls
(gateway/tool_stream.py) over the format's CallReader, each call's arguments re-written as the
whole-reply parse writes them (gateway/json_canonical.py), so that a function_call item's
`response.function_call_arguments.delta` pieces put together are its `arguments` in
`.done`, in the item and in the stored response: today's whole-reply parse, to the byte.

    written   <tool_call>{"name": "f", "arguments": {"city":"Paris"}}</tool_call>
    deltas    '{"city": '  '"Par'  'is"'  '}'          arguments '{"city": "Paris"}'

Chat streams the arguments as the model wrote them (its chunks have no whole to agree with);
here they must equal the item's, and the whole parse re-serializes the arguments of hermes,
llama3_json, mistral and granite (json.dumps), so theirs are re-written; pythonic and qwen3_coder
readers already answer json.dumps text, and deepseek_v3's parse keeps them as written. Where
the two could still differ (Hermes arguments written as a JSON string, which the parse keeps
as written; a key written twice; deepseek_v3 whitespace after the object inside its fence) the
item's arguments are the pieces put together, the same JSON value.
"""

from __future__ import annotations

from troupe.gateway.json_canonical import CanonicalJson
from troupe.gateway.tool_auto import ToolParserName, auto_call_reader, auto_tool_stream
from troupe.gateway.tool_calls import ToolPlan
from troupe.gateway.tool_reader import CallReader, CallSoFar, SectionSoFar
from troupe.gateway.tool_stream import StreamedCalls


class CanonicalReader:
    """A CallReader whose calls' arguments are their json.dumps text so far."""

    def __init__(self, reader: CallReader) -> None:
        self._reader = reader
        self._arguments: list[CanonicalJson] = []  # by call, in order
        self._written: list[str] = []  # what each was fed

    def call_id(self) -> str:
        return self._reader.call_id()

    def read(self, text: str, start: int, *, is_final: bool) -> SectionSoFar:
        section = self._reader.read(text, start, is_final=is_final)
        calls = []
        for i, call in enumerate(section.calls):
            if i == len(self._arguments):
                self._arguments.append(CanonicalJson())
                self._written.append("")
            arguments = call.arguments
            if arguments is not None:
                if not arguments.startswith(self._written[i]):  # a reader's fault: begin
                    self._arguments[i] = CanonicalJson()  # again (StreamedCalls then stops)
                self._written[i] = arguments
                arguments = self._arguments[i].feed(arguments)
            calls.append(CallSoFar(call.name, arguments, call.call_id))
        return SectionSoFar(tuple(calls), section.content)


# the formats whose whole parse re-serializes JSON arguments the model wrote; deepseek_v3's
# passes them on as written (as vLLM's), pythonic and qwen3_coder readers answer json.dumps text
_RESERIALIZED: frozenset[ToolParserName] = frozenset(
    {"hermes", "llama3_json", "mistral", "granite"}
)


def responses_call_stream(plan: ToolPlan) -> StreamedCalls:
    """The streamed reader of a tool_choice "auto" answer under `plan`."""
    reader = auto_call_reader(plan.tools, plan.parser)
    if plan.parser in _RESERIALIZED:
        reader = CanonicalReader(reader)
    return StreamedCalls(auto_tool_stream(plan.tools, plan.parser), reader, plan.names)
