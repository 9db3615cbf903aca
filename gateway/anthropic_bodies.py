"""POST /v1/messages bodies as msgspec Structs (Anthropic's Messages API, as its SDK sends it).

As on chat, an unknown field, a wrong type or a value out of range is a 400 naming its path
(Anthropic's own API refuses unknown fields too). Content blocks are decoded one at a time by
their `type` (gateway/anthropic_messages.py), so an error names the block:
`messages[2].content[0].tool_use_id`; tools likewise (`tools[1].input_schema`).

Fields the SDK may send that change nothing here are accepted and not used: `cache_control`
(troupe caches every prompt's prefix by itself), `metadata` (its user_id is logged),
`service_tier`, `speed`, `inference_geo`, `diagnostics`, `context_management`,
`user_profile_id`, `workspace_id`. `container` and `mcp_servers` (Anthropic's hosted tools)
are refused by name (gateway/anthropic_requests.py).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class CacheControl(_Body, kw_only=True):
    type: Literal["ephemeral"]
    ttl: str | None = None


class TextBlock(_Body, kw_only=True):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(_Body, kw_only=True):
    """A call the model made (an earlier answer's `tool_use` block)."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: dict[str, Any] | None = None


class ToolResultBlock(_Body, kw_only=True):
    """What the client's tool returned for a call; `content` text (or text blocks)."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


class ImageSource(_Body, kw_only=True):
    """An image block's picture: base64 `data` (its `media_type` is not trusted: the engine
    reads the bytes) or a `url` the gateway fetches (gateway/image_fetch.py)."""

    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(_Body, kw_only=True):
    """A user's image, for a model that reads images (others refuse it naming the block)."""

    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControl | None = None


class ThinkingBlock(_Body, kw_only=True):
    """An earlier answer's thinking: it reaches the template as the turn's `reasoning`."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Body, kw_only=True):
    """Thinking another server hid: nothing to render."""

    type: Literal["redacted_thinking"]
    data: str


Block = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)
BLOCK_TYPES: dict[str, type[Block]] = {
    "text": TextBlock,
    "image": ImageBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
}


class InputMessage(_Body, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]  # each block decoded by its type


class CustomTool(_Body, kw_only=True):
    """A client tool: the model calls it with arguments following `input_schema`."""

    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    strict: bool | None = None  # constrained either way, as chat's tools are
    cache_control: CacheControl | None = None
    defer_loading: bool | None = None
    eager_input_streaming: bool | None = None  # every call's input streams as it is written
    input_examples: list[dict[str, Any]] | None = None
    allowed_callers: list[str] | None = None


class ToolChoice(_Body, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # "tool": the one to call
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Body, kw_only=True):
    """`thinking`: whether the model thinks first (the template's `enable_thinking`)."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None  # the thinking_token_budget (gateway/anthropic_requests.py)
    display: Literal["summarized", "omitted"] | None = None


class JsonFormat(_Body, kw_only=True):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = msgspec.field(name="schema")


class OutputConfig(_Body, kw_only=True):
    effort: str | None = None  # the template's `reasoning_effort`, as vLLM passes it
    format: JsonFormat | None = None


class Metadata(_Body, kw_only=True):
    user_id: str | None = None


class MessagesBody(_Body, kw_only=True):
    model: str
    messages: list[InputMessage]
    max_tokens: int
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[dict[str, Any]] | None = None  # each decoded as a CustomTool
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    metadata: Metadata | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extra
    # accepted, not used (module docstring)
    cache_control: CacheControl | None = None
    service_tier: str | None = None
    speed: str | None = None
    inference_geo: str | None = None
    diagnostics: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    # refused by name when set
    container: str | dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] | None = None


class CountTokensBody(_Body, kw_only=True):
    """POST /v1/messages/count_tokens: what the prompt is made of, nothing to generate."""

    model: str
    messages: list[InputMessage]
    system: str | list[TextBlock] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_control: CacheControl | None = None
    context_management: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] | None = None
