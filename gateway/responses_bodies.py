"""POST /v1/responses bodies as msgspec Structs (OpenAI's Responses API; vLLM's extras).

As on chat, an unknown field, a wrong type or a value out of range is a 400 naming its path.
`input` items are decoded one at a time by their `type` (a message may leave it out), so an
error names the item: `input[2].call_id`. The item Structs list every field OpenAI's own items
carry, so a client may send a response's `output` back as the next request's `input`.
Content parts are read for their `type` and `text` only, as chat's are (output_text parts come
back with `annotations` and `logprobs`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

ItemStatus = Literal["in_progress", "completed", "incomplete"]
# OpenAI's metadata limits: 16 pairs, keys up to 64 characters, values up to 512
_Key = Annotated[str, msgspec.Meta(max_length=64)]
_Value = Annotated[str, msgspec.Meta(max_length=512)]
Metadata = Annotated[dict[_Key, _Value], msgspec.Meta(max_length=16)]


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class TextFormat(_Body, kw_only=True):
    """`text.format`: plain text, any JSON object, or JSON following `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = msgspec.field(default=None, name="schema")
    strict: bool | None = None  # strict or not, troupe constrains the output fully


class TextConfig(_Body, kw_only=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, not used


class FunctionTool(_Body, kw_only=True):
    """A function tool, flat (chat nests the same fields under `function`)."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # constrained either way, as on chat


class FunctionChoice(_Body, kw_only=True):
    type: Literal["function"]
    name: str


ToolChoice = Literal["none", "auto", "required"] | FunctionChoice


class ReasoningConfig(_Body, kw_only=True):
    """`reasoning`: `effort` goes to the chat template as `reasoning_effort` (vLLM's)."""

    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class StreamOptions(_Body, kw_only=True):
    include_obfuscation: bool | None = None  # accepted: troupe never pads its events


class ResponsesBody(_Body, kw_only=True):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = None  # each decoded by its type (FunctionTool)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    metadata: Metadata | None = None
    user: str | None = None
    safety_identifier: str | None = None  # OpenAI's successor of `user`: logged alike
    prompt_cache_key: str | None = None  # accepted, not used (as in vLLM)
    service_tier: str | None = None  # accepted and echoed
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    # Not served (only their neutral value passes; gateway/responses_requests.py names them)
    store: bool | None = None  # gateway/responses_requests.py: true unless sent false
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None  # needs store (gateway/responses_background.py)
    max_tool_calls: int | None = None
    prompt: dict[str, Any] | None = None
    # vLLM's extras, passed to SamplingParams under the same names
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    priority: int | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    min_tokens: int | None = None
    cache_salt: str | None = None


# -- input items -----------------------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    """A part of a message's content (or of a function's output): text, or a user message's
    `input_image` (`image_url`: a data URL or an http(s) URL; `detail` is not read)."""

    type: str
    text: str | None = None
    image_url: str | None = None
    detail: str | None = None


class MessageItem(_Body, kw_only=True):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    phase: str | None = None


class FunctionCallItem(_Body, kw_only=True):
    """A call the model made (an earlier answer's `function_call` output item)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None


class FunctionCallOutputItem(_Body, kw_only=True):
    """What the client's function returned for a call."""

    type: Literal["function_call_output"]
    output: str | list[ContentPart]
    call_id: str | None = None
    id: str | None = None
    status: ItemStatus | None = None
    name: str | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None


class ReasoningItem(_Body, kw_only=True):
    """An earlier answer's thinking: its `reasoning_text` parts become the next assistant
    turn's reasoning (gateway/responses_input.py)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = msgspec.field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
ITEM_TYPES: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}
