"""Tool calls on chat completions: `tools` + `tool_choice` -> a constraint, text -> tool_calls.

`tool_choice` "required": the model writes a JSON array of calls, each
{"name": one of the tools, "arguments": that tool's parameters}, constrained by one schema
(one call when parallel_tool_calls is false). A named function: the model writes its
arguments, constrained by its parameters schema. "none": the tools are not used. "auto" (the
default when tools are sent): the model's own tool-call format, parsed out of free text, where
its chat template defines the one troupe parses or the server names one (`--tool-call-parser`,
gateway/tool_auto.py); elsewhere a 400 says what is supported.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

import msgspec
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.tool_auto import ToolParserName
from troupe.gateway.tool_reader import openai_call_id
from troupe.messages import StructuredOutputs


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ToolFunction(_Body, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # constrained either way


class Tool(_Body, kw_only=True):
    type: Literal["function"]
    function: ToolFunction


class ChoiceName(_Body, kw_only=True):
    name: str


class NamedToolChoice(_Body, kw_only=True):
    type: Literal["function"]
    function: ChoiceName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """How this request calls tools: `name` set for a named function, else "required"; no
    `spec`: "auto", the `tools` rendered into the prompt by the chat template."""

    spec: StructuredOutputs | None
    name: str | None = None
    tools: tuple[dict[str, Any], ...] = ()  # "auto": the request's tools, as sent
    parser: ToolParserName = "hermes"  # "auto": the format the reply is parsed in

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)


def auto_refused(alternatives: str) -> ApiError:
    """The 400 for tool_choice "auto" on a server that reads no tool-call format for this
    model; `alternatives`: the choices the API offers instead."""
    return invalid(
        "tool_choice",
        'tool_choice "auto" needs a tool-call format troupe reads: one the chat template writes '
        "(Hermes/Qwen <tool_call> tags, Qwen3-Coder, GLM-4.5, Kimi K2, MiniMax-M2, GPT-OSS under "
        "--reasoning-parser openai_gptoss) or the server's --tool-call-parser (e.g. "
        "llama3_json), with --enable-auto-tool-choice (on unless the server turned it off); "
        f"this server has none for this model: send {alternatives}",
    )


def tool_plan(
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    parallel: bool | None,
    *,
    tool_parser: ToolParserName | None = None,
) -> ToolPlan | None:
    """The constraint the tool fields ask for (None: plain text), or a 400 naming the field.
    `tool_parser`: the format "auto" replies are parsed in (None: "auto" is refused)."""
    if not tools:
        if choice not in (None, "none"):
            raise invalid("tool_choice", "tool_choice needs tools")
        return None
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise invalid("tools", "tool function names must be distinct")
    if choice == "none":
        return None
    if (choice is None or choice == "auto") and tool_parser is not None:
        return ToolPlan(None, tools=tuple(as_sent(t) for t in tools), parser=tool_parser)
    if choice is None or choice == "auto":
        raise auto_refused('"required", a named function {"type": "function", "function": '
                           '{"name": ...}}, or "none"')  # fmt: skip
    by_name = {t.function.name: t.function for t in tools}
    if isinstance(choice, NamedToolChoice):
        function = by_name.get(choice.function.name)
        if function is None:
            raise invalid("tool_choice.function.name", f"no tool named {choice.function.name!r}")
        return ToolPlan(
            StructuredOutputs.from_schema(function.parameters or _ANY_OBJECT), function.name
        )
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, "arguments": f.parameters or _ANY_OBJECT},
            "required": ["name", "arguments"],
        }
        for f in by_name.values()
    ]
    item = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {"type": "array", "items": item, "minItems": 1}
    if parallel is False:
        schema["maxItems"] = 1
    return ToolPlan(StructuredOutputs.from_schema(schema))


def as_sent(tool: Tool) -> dict[str, Any]:
    """A tool as the template sees it: the client's fields, none it left out."""
    out: dict[str, Any] = msgspec.to_builtins(tool)
    out["function"] = {k: v for k, v in out["function"].items() if v is not None}
    return out


def tool_calls(plan: ToolPlan, text: str) -> list[dict[str, Any]] | None:
    """The calls the text makes, as OpenAI's `tool_calls`; None if it does not parse (cut
    short by max_tokens or a stop string)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if plan.name is not None:
        pairs = [(plan.name, value)]
    else:
        pairs = [(call["name"], call["arguments"]) for call in value]
    return [
        {
            "id": openai_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }
        for name, args in pairs
    ]


class ToolCallStream:
    """SSE deltas of one request's tool calls. A named function streams its arguments as the
    model writes them; "required" calls are parsed whole at the end (one delta per call)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self._id = openai_call_id()
        self._opened = False

    def delta(self, text: str) -> list[list[dict[str, Any]]]:
        """`tool_calls` delta lists for a piece of generated text (maybe none)."""
        self.text += text
        if self.plan.name is None or not text:
            return []
        out: list[list[dict[str, Any]]] = []
        if not self._opened:
            self._opened = True
            head = {"id": self._id, "type": "function"}
            out.append(
                [{"index": 0, **head, "function": {"name": self.plan.name, "arguments": ""}}]
            )
        out.append([{"index": 0, "function": {"arguments": text}}])
        return out

    def finish(self) -> list[dict[str, Any]] | None:
        """The last tool_calls delta ("required": every call); None if the text did not parse."""
        if self.plan.name is not None:
            return [] if tool_calls(self.plan, self.text) is not None else None
        calls = tool_calls(self.plan, self.text)
        if calls is None:
            return None
        return [{"index": i, **call} for i, call in enumerate(calls)]
