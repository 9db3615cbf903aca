"""OpenAI request bodies as msgspec Structs: every field typed in one place.

Decoding straight into these bounds what a client can send: a field of the wrong type, an
unknown field or a number out of range fails at the byte it is in, with its path; a nested
value where a number belongs fails at its first bracket instead of being walked. Ranges are
checked afterwards by SamplingParams.check (the engine's own limits, shared with the Python
API), and the fields troupe does not support yet by `openai_requests`.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

import msgspec
from troupe.gateway.errors import invalid
from troupe.gateway.structured_requests import StructuredFields
from troupe.gateway.tool_calls import Tool, ToolChoice
from troupe.messages import ToolCall

Role = Literal["system", "developer", "user", "assistant", "tool"]


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class StreamOptions(_Body, kw_only=True):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's: usage on every chunk


class ImageUrl(msgspec.Struct, kw_only=True):
    """An image part's image: a data URL or an http(s) URL (actors/core/content_parts.py); `detail` is accepted and
    not read (the model's processor decides the resolution)."""

    url: str
    detail: str | None = None


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a message's content: text, or an image (for a model that reads images);
    other types are named in a 400."""

    type: str
    text: str | None = None
    image_url: ImageUrl | str | None = None


class Message(_Body, kw_only=True):
    """A chat message (gateway/chat_messages.py turns it into the engine's ChatMessage)."""

    role: Role
    # null or left out only by an assistant message with tool_calls (a 400 elsewhere)
    content: str | list[ContentPart] | None = None
    name: str | None = None  # passed to the template, as vLLM passes it
    tool_calls: list[ToolCall] | None = None  # assistant: the calls it made (OpenAI's shape)
    tool_call_id: str | None = None  # tool: the call this message answers
    # assistant: the thinking an earlier answer returned (the openai client sends a returned
    # message back whole); vLLM's `reasoning` is the same field
    reasoning_content: str | None = None
    reasoning: str | None = None


class _Common(StructuredFields, kw_only=True):
    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    priority: int | None = None  # vLLM's extra, passed through: lower is served first
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> [-100, 100]
    min_tokens: int | None = None  # vLLM's extra
    # vLLM's: thinking past this many tokens is closed (the reasoning parser's tags)
    thinking_token_budget: int | None = None
    allowed_token_ids: list[int] | None = None  # vLLM's extra: only these may be sampled
    bad_words: list[str] | None = None  # vLLM's extra: words never generated
    truncate_prompt_tokens: int | None = None  # vLLM's extra: keep the last k prompt tokens
    # vLLM's extra: encode the prompt with the model's special tokens (None: completions'
    # text with, chat's rendered messages without, as there)
    add_special_tokens: bool | None = None
    prompt_logprobs: int | None = None  # vLLM's extra: each prompt token's logprob + top-k
    streaming_window: int | None = None  # StreamingLLM (troupe's): sinks + window of KV
    sink_tokens: int | None = None
    cache_salt: str | None = None  # vLLM's: prefix-cache hits only among the same salt
    # vLLM's: logprobs name tokens "token_id:{id}" (None: the server's flag decides)
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: the prompt's and each answer's token ids beside the text (gateway/token_ids_out.py)
    return_token_ids: bool | None = None
    user: str | None = None  # accepted: an end-user id for the operator's logs (OpenAI's)
    request_id: str | None = None  # vLLM's: the answer's id after its prefix (X-Request-Id wins)
    # vLLM's beam search extras: n beams, ranked by logprob / length ** length_penalty
    use_beam_search: bool = False
    length_penalty: float | None = None


class CompletionBody(_Common, kw_only=True):
    # One prompt: text, token ids, or a list holding one of those (checked after decoding).
    # May be left out when prompt_embeds is given (one of the two is required).
    prompt: str | list[str | int | list[int]] | None = None
    # vLLM's (--enable-prompt-embeds): base64 of torch.save'd [seq_len, hidden_size] tensors,
    # each a prompt of its own, run before `prompt`'s (gateway/prompt_embeds_body.py)
    prompt_embeds: str | list[str] | None = None
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


class ChatBody(_Common, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    # vLLM's chat-template extras (HF apply_chat_template's options)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None  # vLLM's: RAG templates' `documents`
    # OpenAI's; the chat template's `reasoning_effort` (gpt-oss-style templates read it)
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    # vLLM's: the last message's content leads the answer when it is in the answer's role
    echo: bool = False
    # vLLM's: false leaves the reasoning parser's thinking out (no reasoning_content)
    include_reasoning: bool = True


T = TypeVar("T")

# characters of a client's request id: a websocket frame's, X-Request-Id or a body's request_id
MAX_REQUEST_ID = 128

_PATH = re.compile(r" - at `(?:key` in `)?\$\.?(.*)`$")
_FIELD = re.compile(r"(?:unknown|missing required) field `([^`]*)`")


def field_path(exc: msgspec.ValidationError, default: str = "body") -> str:
    """The field a msgspec error is about, as the client wrote it: `messages[0].content`."""
    text = str(exc)
    match = _PATH.search(text)
    path = match.group(1) if match else ""
    named = _FIELD.search(text)
    if named:  # unknown or missing field: msgspec points at its parent object
        path = f"{path}.{named.group(1)}" if path else named.group(1)
    # a dict's value is `[...]` to msgspec: name the dict (`logit_bias`)
    return path.replace("[...]", "") or default


def reason(exc: msgspec.ValidationError) -> str:
    """msgspec's message without its ` - at `$...`` suffix (the field is named apart)."""
    return _PATH.sub("", str(exc))


def decode_body(raw: bytes, body_type: type[T]) -> T:
    """JSON bytes -> `body_type`, or a 400 naming the field (the whole body: `body`)."""
    try:
        return msgspec.json.decode(raw, type=body_type)
    except msgspec.ValidationError as exc:
        field = field_path(exc)
        raise invalid(field, f"invalid '{field}': {reason(exc)}") from None
    except msgspec.DecodeError as exc:
        raise invalid("body", f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        # msgspec guards its recursion with the interpreter's limit; the body is just hostile.
        raise invalid("body", "request body is nested too deeply") from None


def convert_field(value: Any, field_type: Any, field: str) -> Any:
    """An already decoded value -> `field_type`, or a 400 naming `field` (and the path in it)."""
    try:
        return msgspec.convert(value, field_type)
    except msgspec.ValidationError as exc:
        inner = field_path(exc, "")
        where = (
            f"{field}{inner}" if inner.startswith("[") else ".".join(filter(None, (field, inner)))
        )
        raise invalid(where, f"invalid '{where}': {reason(exc)}") from None
    except RecursionError:
        raise invalid(field, f"'{field}' is nested too deeply") from None


__all__ = [
    "ChatBody",
    "CompletionBody",
    "ContentPart",
    "Message",
    "convert_field",
    "decode_body",
    "field_path",
    "reason",
]
