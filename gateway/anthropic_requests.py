"""A POST /v1/messages body -> a chat prompt + SamplingParams + tool plan, or a named 400.

Anthropic's Messages API is chat in other words, so it runs chat's machinery, as vLLM's and
SGLang's /v1/messages do: the messages become chat messages (gateway/anthropic_messages.py)
rendered by the model's template, `tools` and `tool_choice` chat's ToolPlan
(gateway/tool_calls.py; the tools reach the template whatever tool_choice says, as on chat),
`output_config.format` the structured output chat's `response_format` makes, and
SamplingParams.check the ranges (named as the client wrote them).

    max_tokens, temperature, top_p, top_k  ->  the same SamplingParams fields (max_tokens must
                                               fit the context with the prompt, as on chat)
    stop_sequences                         ->  stop
    tool_choice auto | any | tool | none   ->  chat's "auto" | "required" | a named
                                               function | "none"; disable_parallel_tool_use
                                               -> parallel_tool_calls false
    thinking enabled / adaptive | disabled ->  the template's enable_thinking true | false
    output_config.effort                   ->  the template's reasoning_effort
    chat_template_kwargs (vLLM's)          ->  the template, over the above

`thinking.budget_tokens` (with thinking enabled) is the thinking_token_budget: past it the
reasoning parser's closing tag is forced (gateway/chat_reasoning.py). A server whose parser has
no tags (or none) accepts it without enforcing it, as before: a client such as Claude Code
sends it to any server, and max_tokens still bounds the whole answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from troupe.gateway.anthropic_bodies import CountTokensBody, CustomTool, MessagesBody
from troupe.gateway.anthropic_messages import chat_messages, ends_with_assistant
from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import convert_field, decode_body
from troupe.gateway.structured_requests import checked_spec
from troupe.gateway.tool_auto import ToolParserName
from troupe.gateway.tool_calls import (
    ChoiceName,
    NamedToolChoice,
    Tool,
    ToolChoice,
    ToolFunction,
    ToolPlan,
    as_sent,
    auto_refused,
    tool_plan,
)
from troupe.messages import ChatPrompt, ParamError, SamplingParams, StructuredOutputs
from troupe.messages.sampling_defaults import NO_DEFAULTS, SamplingDefaults

# engine field -> the client's
_RENAMED = {"stop": "stop_sequences", "thinking_token_budget": "thinking.budget_tokens"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MessagesRequest:
    """A checked request: what to run, and what the answer repeats of it."""

    model: str
    prompt: ChatPrompt
    params: SamplingParams
    stream: bool
    tools: ToolPlan | None
    client_fields: dict[str, str]  # engine field -> the field the client wrote
    user: str | None

    def with_lora(self, lora: str | None) -> MessagesRequest:
        """This request on the LoRA adapter its `model` selects (None: the base model)."""
        if lora is None:
            return self
        return dataclasses.replace(self, params=msgspec.structs.replace(self.params, lora=lora))


def parse_messages(
    raw: bytes, *, tool_parser: ToolParserName | None, defaults: SamplingDefaults = NO_DEFAULTS
) -> MessagesRequest:
    """Decode and check a JSON body; raise ApiError(400) naming the first bad field.
    `tool_parser`: the format of the model's tool calls (tool_choice "auto" reads replies in
    it); None where the template has none. `defaults`: the engine's, for the sampling fields
    the body leaves out."""
    body = decode_body(raw, MessagesBody)
    if body.container is not None:
        raise invalid("container", "container (Anthropic's code execution) is not served here")
    if body.mcp_servers:
        raise invalid("mcp_servers", "mcp_servers is not served here: call MCP tools as tools")
    # required, so always named: it must fit the context (a 400 naming it), as chat's does
    kw: dict[str, Any] = {"max_tokens": body.max_tokens, "strict_max_tokens": True}
    for name in ("temperature", "top_p", "top_k"):
        if getattr(body, name) is not None:
            kw[name] = getattr(body, name)
    if body.stop_sequences:
        kw["stop"] = tuple(body.stop_sequences)
    thinking = body.thinking
    if thinking is not None and thinking.type == "enabled" and thinking.budget_tokens is not None:
        kw["thinking_token_budget"] = thinking.budget_tokens
    client_fields = dict(_RENAMED)
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is not None:
        spec = StructuredOutputs.from_schema(fmt.json_schema)
        kw["structured_outputs"], renames = checked_spec("output_config.format.schema", spec)
        client_fields.update(renames)
    tools = _tools(body.tools)
    plan = _tool_plan(tools, body, tool_parser)
    if plan is not None and plan.spec is not None:
        if "structured_outputs" in kw:
            raise invalid(
                "output_config.format", "output_config.format and tool use cannot be combined"
            )
        kw["structured_outputs"] = plan.spec
        client_fields.update({"structured_outputs.json": "tools", "structured_outputs": "tools"})
    params = SamplingParams(**defaults.fill(kw))
    try:
        params.check()
    except ParamError as exc:
        raise invalid(client_fields.get(exc.field, exc.field), str(exc)) from None
    return MessagesRequest(
        model=body.model,
        prompt=_prompt(body, tools),
        params=params,
        stream=bool(body.stream),
        tools=plan,
        client_fields=client_fields,
        user=body.metadata.user_id if body.metadata is not None else None,
    )


def parse_count_tokens(raw: bytes) -> tuple[str, ChatPrompt]:
    """A count_tokens body -> its model and the prompt a Messages request of it renders."""
    body = decode_body(raw, CountTokensBody)
    if body.mcp_servers:
        raise invalid("mcp_servers", "mcp_servers is not served here: call MCP tools as tools")
    return body.model, _prompt(body, _tools(body.tools))


def _prompt(body: MessagesBody | CountTokensBody, tools: list[Tool]) -> ChatPrompt:
    messages = chat_messages(body.system, body.messages)
    template_kwargs: dict[str, Any] = {}
    if tools:  # whatever tool_choice says, as chat's (vLLM's default): the same prompt
        template_kwargs["tools"] = [as_sent(t) for t in tools]
    if body.thinking is not None:
        template_kwargs["enable_thinking"] = body.thinking.type != "disabled"
    if body.output_config is not None and body.output_config.effort is not None:
        template_kwargs["reasoning_effort"] = body.output_config.effort
    template_kwargs.update(body.chat_template_kwargs or {})
    is_prefill = ends_with_assistant(messages)
    return ChatPrompt(
        messages=tuple(messages),
        add_generation_prompt=not is_prefill,
        continue_final_message=is_prefill,
        template_kwargs=template_kwargs or None,
    )


def _tools(raw: list[dict[str, Any]] | None) -> list[Tool]:
    """The client's tools in chat's nesting (what vLLM hands the template)."""
    tools = []
    for i, entry in enumerate(raw or ()):
        kind = entry.get("type")
        if kind not in (None, "custom"):
            raise invalid(
                f"tools[{i}].type",
                f"tools[{i}].type: only client tools (name, description, input_schema) are "
                f"served here, got {kind!r:.40}",
            )
        tool: CustomTool = convert_field(entry, CustomTool, f"tools[{i}]")
        function = ToolFunction(
            name=tool.name,
            description=tool.description,
            parameters=tool.input_schema,
            strict=tool.strict,
        )
        tools.append(Tool(type="function", function=function))
    return tools


def _tool_plan(
    tools: list[Tool], body: MessagesBody, tool_parser: ToolParserName | None
) -> ToolPlan | None:
    choice = body.tool_choice
    kind = "auto" if choice is None else choice.type
    if tools and kind == "auto" and tool_parser is None:
        raise auto_refused('{"type": "any"}, {"type": "tool", "name": ...} or {"type": "none"}')
    chat_choice: ToolChoice | None = {"auto": None, "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        name = choice.name if choice is not None else None
        if name is None:
            raise invalid("tool_choice.name", 'tool_choice {"type": "tool"} needs a name')
        if name not in {t.function.name for t in tools}:
            raise invalid("tool_choice.name", f"no tool named {name!r:.100}")
        chat_choice = NamedToolChoice(type="function", function=ChoiceName(name=name))
    parallel = None if choice is None or not choice.disable_parallel_tool_use else False
    return tool_plan(tools or None, chat_choice, parallel, tool_parser=tool_parser)
