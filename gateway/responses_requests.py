"""A POST /v1/responses body -> chat messages + SamplingParams + tool plan, or a named 400.

The Responses API is chat in other words, so it runs chat's machinery: its items become chat
messages (gateway/responses_input.py) rendered by the model's template, `text.format` the
structured output `response_format` makes on chat (gateway/structured_requests.py), `tools`
and `tool_choice` chat's ToolPlan (gateway/tool_calls.py, gateway/tool_auto.py; the tools reach
the template under every tool_choice, as chat's), and SamplingParams.check the ranges
(`max_output_tokens` named as the client wrote it).

`previous_response_id` continues a stored response (gateway/responses_store.py): its input
items and output are read before `input` (its `instructions` are not, as on OpenAI); an id the
store does not hold is OpenAI's 400 `previous_response_not_found`. `store` (true unless sent
false) keeps the answer when the server stores responses (--max-stored-responses), and is
ignored when it does not, as vLLM ignores it without VLLM_ENABLE_RESPONSES_API_STORE.
`background` (gateway/responses_background.py) needs both, else a 400 naming it, as vLLM's.

Not served, each named in a 400: `conversation` (use previous_response_id, or send the
conversation in `input`), `prompt` (templates), `max_tool_calls`,
`top_logprobs` and the `include` of logprobs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.openai_bodies import convert_field, decode_body
from troupe.gateway.openai_requests import chat_prompt
from troupe.gateway.responses_bodies import FunctionChoice, FunctionTool, ResponsesBody
from troupe.gateway.responses_history import check_unique_ids, stored_items
from troupe.gateway.responses_input import input_messages
from troupe.gateway.responses_store import ResponseStore
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
from troupe.messages import ChatMessage, ChatPrompt, ParamError, SamplingParams, StructuredOutputs
from troupe.messages.sampling_defaults import NO_DEFAULTS, SamplingDefaults

# Fields passed to SamplingParams under the same name (vLLM's extras included).
_PASSTHROUGH = (
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "ignore_eos", "priority", "skip_special_tokens",
    "include_stop_str_in_output", "min_tokens", "cache_salt",
)  # fmt: skip
_NO_CONVERSATIONS = (
    "troupe keeps no conversation objects: continue a response with previous_response_id, or "
    "send the whole conversation in 'input' (an earlier answer's output items may be sent back "
    "as they came)"
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResponsesRequest:
    """A checked request: what to run, and what the answer repeats of it."""

    model: str | None
    prompt: list[ChatMessage] | ChatPrompt
    params: SamplingParams
    stream: bool
    tools: ToolPlan | None
    client_fields: dict[str, str]  # engine field -> the field the client wrote
    echo: dict[str, Any]  # the request's settings, as the response object repeats them
    user: str | None
    items: list[dict[str, Any]]  # the input items it stores: the earlier turns', then its own
    is_stored: bool  # store asked for (OpenAI's default) and the server stores responses
    is_background: bool  # run on after the create call answers (gateway/responses_background.py)

    def with_lora(self, lora: str | None) -> ResponsesRequest:
        """This request on the LoRA adapter its `model` selects (None: the base model)."""
        if lora is None:
            return self
        return dataclasses.replace(self, params=msgspec.structs.replace(self.params, lora=lora))


def parse_responses(
    raw: bytes,
    *,
    default_max_tokens: int,
    tool_parser: ToolParserName | None,
    store: ResponseStore | None = None,
    defaults: SamplingDefaults = NO_DEFAULTS,
) -> ResponsesRequest:
    """Decode and check a JSON body; raise ApiError(400) naming the first bad field.
    `tool_parser`: the format of the model's tool calls (tool_choice "auto" reads replies in
    it); None where the template has none.
    `store`: the server's stored responses (None: it stores none). `defaults`: the engine's,
    for the sampling fields the body leaves out."""
    body = decode_body(raw, ResponsesBody)
    _refuse_unsupported(body)
    _check_background(body, store)
    kw: dict[str, Any] = {k: getattr(body, k) for k in _PASSTHROUGH if getattr(body, k) is not None}
    requested = body.max_output_tokens
    kw["max_tokens"] = default_max_tokens if requested is None else requested
    if body.stop is not None:
        kw["stop"] = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    if body.truncation == "auto":  # vLLM's: keep the prompt's last max_model_len tokens
        kw["truncate_prompt_tokens"] = -1
    client_fields: dict[str, str] = {}
    spec = _text_format(body)
    if spec is not None:
        kw["structured_outputs"], client_fields = spec
    function_tools = [_function_tool(t, f"tools[{i}]") for i, t in enumerate(body.tools or ())]
    chat_tools = [_chat_tool(t) for t in function_tools]
    tools = _tool_plan(chat_tools, body, tool_parser)
    if tools is not None and tools.spec is not None:
        if "structured_outputs" in kw:
            raise invalid("text.format", "text.format and tool calls cannot be combined")
        kw["structured_outputs"] = tools.spec
        client_fields = {"structured_outputs.json": "tools", "structured_outputs": "tools"}
    params = SamplingParams(**defaults.fill(kw))
    try:
        params.check()
    except ParamError as exc:
        renamed = {"max_tokens": "max_output_tokens", **client_fields}
        raise invalid(renamed.get(exc.field, exc.field), str(exc)) from None
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options", "stream_options needs stream: true")

    history = _history(body.previous_response_id, store)
    messages = input_messages(body.input, body.instructions, history)
    is_stored = store is not None and body.store is not False
    items: list[dict[str, Any]] = []  # needed only to store or to continue a response
    if is_stored or history:
        items = [*history, *stored_items(body.input)]
        check_unique_ids(items, len(history))
    template_kwargs: dict[str, Any] = {}
    if chat_tools:  # whatever tool_choice says, as chat's (vLLM's default): the same prompt
        template_kwargs["tools"] = [as_sent(t) for t in chat_tools]  # in chat's shape
    if body.reasoning is not None and body.reasoning.effort is not None:
        template_kwargs["reasoning_effort"] = body.reasoning.effort  # vLLM's template variable
    prompt = chat_prompt(messages, True, False, template_kwargs)
    return ResponsesRequest(
        model=body.model,
        prompt=prompt,
        params=params,
        stream=bool(body.stream),
        tools=tools,
        client_fields=client_fields,
        echo=_echo(body, function_tools, params),
        user=body.user or body.safety_identifier,
        items=items,
        is_stored=is_stored,
        is_background=bool(body.background),
    )


def _history(previous_response_id: str | None, store: ResponseStore | None) -> list[dict[str, Any]]:
    """The items a response continuing `previous_response_id` starts from; OpenAI's 400 for
    an id the store does not hold (never stored, evicted, deleted, or no store at all)."""
    if previous_response_id is None:
        return []
    previous = store.get(previous_response_id) if store is not None else None
    if previous is None:
        why = "" if store is not None else " (this server stores no responses)"
        raise ApiError(
            400,
            f"Previous response with id {previous_response_id!r:.100} not found{why}.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return previous.context()


def _check_background(body: ResponsesBody, store: ResponseStore | None) -> None:
    """vLLM's rules: background needs `store` (true unless sent false) and a server that
    stores responses, which runs at most its store's bound of them at once."""
    if not body.background:
        return
    if body.store is False:
        raise invalid("background", "background can only be used when `store` is true")
    if store is None:
        raise invalid(
            "background",
            "background needs stored responses, and this server stores none "
            "(start it with --max-stored-responses N)",
        )
    if store.num_running >= store.max_entries:
        raise ApiError(
            429,
            f"background: {store.num_running} background responses are running, the most "
            "this server's store holds (--max-stored-responses); retry when one ends",
            param="background",
            code="too_many_background_responses",
        )


def _refuse_unsupported(body: ResponsesBody) -> None:
    if body.conversation is not None:
        raise invalid("conversation", f"conversation is not supported: {_NO_CONVERSATIONS}")
    if body.prompt is not None:
        raise invalid("prompt", "prompt templates are not supported: send 'input'")
    if body.max_tool_calls is not None:
        raise invalid("max_tool_calls", "max_tool_calls is not supported: leave it out")
    if body.top_logprobs:
        raise invalid("top_logprobs", "top_logprobs is not supported on /v1/responses yet")
    for i, name in enumerate(body.include or ()):
        if name == "message.output_text.logprobs":
            raise invalid(f"include[{i}]", "output logprobs are not supported on /v1/responses")


def _text_format(body: ResponsesBody) -> tuple[StructuredOutputs, dict[str, str]] | None:
    """`text.format` -> the constraint (None: free text)."""
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return checked_spec("text.format", StructuredOutputs(json_object=True))
    if fmt.json_schema is None:
        raise invalid("text.format.schema", 'text.format {"type": "json_schema"} needs a schema')
    spec = StructuredOutputs.from_schema(fmt.json_schema)
    return checked_spec("text.format.schema", spec)


def _tool_plan(
    tools: list[Tool], body: ResponsesBody, tool_parser: ToolParserName | None
) -> ToolPlan | None:
    """chat's ToolPlan for the request's function tools and tool_choice."""
    choice = body.tool_choice
    if tools and (choice is None or choice == "auto") and tool_parser is None:
        raise auto_refused(
            '"required", a named function {"type": "function", "name": ...}, or "none"'
        )
    chat_choice: ToolChoice | None
    if isinstance(choice, FunctionChoice):
        if choice.name not in {t.function.name for t in tools}:
            raise invalid("tool_choice.name", f"no tool named {choice.name!r}")
        chat_choice = NamedToolChoice(type="function", function=ChoiceName(name=choice.name))
    else:
        chat_choice = None if choice == "auto" else choice
    return tool_plan(tools or None, chat_choice, body.parallel_tool_calls, tool_parser=tool_parser)


def _chat_tool(tool: FunctionTool) -> Tool:
    """A Responses function tool in chat's nesting (what vLLM hands the template)."""
    function = ToolFunction(
        name=tool.name, description=tool.description, parameters=tool.parameters, strict=tool.strict
    )
    return Tool(type="function", function=function)


def _function_tool(raw: dict[str, Any], where: str) -> FunctionTool:
    kind = raw.get("type")
    if kind != "function":
        raise invalid(
            f"{where}.type", f"{where}.type: only function tools are supported, got {kind!r:.40}"
        )
    tool: FunctionTool = convert_field(raw, FunctionTool, where)
    return tool


def _echo(body: ResponsesBody, tools: list[FunctionTool], params: SamplingParams) -> dict[str, Any]:
    """The settings a response object repeats (OpenAI's fields; the sampling ones as run)."""
    tool_choice: Any = "auto" if body.tool_choice is None else msgspec.to_builtins(body.tool_choice)
    text = msgspec.to_builtins(body.text) if body.text is not None else None
    return {
        "background": bool(body.background),
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": msgspec.to_builtins(body.reasoning) if body.reasoning is not None else None,
        "service_tier": body.service_tier or "auto",
        "temperature": params.temperature,
        "text": text or {"format": {"type": "text"}},
        "tool_choice": tool_choice,
        "tools": [msgspec.to_builtins(t) for t in tools],
        "top_logprobs": 0,
        "top_p": params.top_p,
        "truncation": body.truncation or "disabled",
        "user": body.user,
    }
