"""Enums and small value types shared by several inboxes."""

from __future__ import annotations

import enum
from typing import Literal

import msgspec
from troupe.messages.images import ChatPart


class FinishReason(enum.StrEnum):
    """Why a request ended. STOP/LENGTH are normal ends; the rest are terminal failures."""

    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"  # the client went away or cancelled
    ERROR = "error"  # the engine failed this request


class RejectCode(enum.StrEnum):
    """Why a request was turned away before it ran."""

    INVALID_REQUEST = "invalid_request"  # a field is malformed or out of range
    TOO_LONG = "too_long"  # prompt (+ max_tokens) over max_model_len
    OVERLOADED = "overloaded"  # queue limits reached; retry later
    SHUTTING_DOWN = "shutting_down"


class LoraErrorCode(enum.StrEnum):
    """Why a LoRA adapter could not be loaded or unloaded at run time (actors/lora_registry.py);
    the gateway answers by it (gateway/lora_routes.py), in this and in the engine's process."""

    LORA_DISABLED = "lora_disabled"  # the engine runs no LoRA (enable_lora, lora_modules)
    INVALID_VALUE = "invalid_value"  # a malformed name or path
    EXISTS = "lora_adapter_exists"  # the name is taken
    NOT_FOUND = "lora_adapter_not_found"  # no adapter of that name is loaded
    IN_USE = "lora_adapter_in_use"  # requests run on it: unload it once they end


class ToolCallFunction(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The function an assistant's tool call names; `arguments` is a JSON object's text, as
    OpenAI sends it (the chat template gets it parsed: actors/core/chat_messages.py)."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One call of an assistant message's `tool_calls` (OpenAI's shape)."""

    id: str
    function: ToolCallFunction
    type: Literal["function"] = "function"


class ChatMessage(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """One chat message, OpenAI's fields. `content` may be left out (None) only by an assistant
    message that carries `tool_calls`; `tool_call_id` answers a call (role "tool"); `name` and
    `reasoning` (the thinking of an earlier assistant turn) reach the template as vLLM passes
    them. The edges check these rules (actors/core/chat_messages.check_chat_messages).
    omit_defaults: a role + content message encodes as it did before the optional fields."""

    role: str
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None
    # content with images: its text and image parts in order (messages/images.py); `content`
    # then holds the text parts alone, joined, for whatever reads a message as text
    parts: tuple[ChatPart, ...] | None = None


class ChatPrompt(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Chat messages with the chat template's options, as HF `apply_chat_template` takes them
    (and vLLM's chat endpoint): a prompt for Engine.generate.

    `continue_final_message`: the last message is left open (the model continues it), which
    needs `add_generation_prompt` false. `template_kwargs`: more template variables
    (`enable_thinking`, `documents`, ...); JSON values."""

    messages: tuple[ChatMessage, ...]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: dict[str, object] | None = None


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """The sampled token's logprob and the top-n alternatives (token id, logprob); `rank`:
    its place among all tokens by logprob (1 = the likeliest), where computed (prompt
    logprobs: vLLM's `rank`)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds, from engine-stamped times carried in messages (so replays reproduce them).

    The phases are vLLM's (its request_*_time_seconds metrics): queue = arrival to first
    scheduled, prefill = first scheduled to first token, decode = first to last token,
    inference = first scheduled to last token; None where a phase never began. A preemption
    does not move "first scheduled": its time counts in the phase it interrupted.
    """

    ttft: float | None  # arrival to first token
    tpot: float | None  # mean time per output token after the first
    e2e: float  # arrival to the terminal event
    queue: float | None = None
    prefill: float | None = None
    decode: float | None = None
    inference: float | None = None


class CacheDropped(msgspec.Struct, frozen=True, kw_only=True):
    """In an AllocationResult: the batch's DropCachedBlocks forgot these cached blocks (and in
    the replies of the engine's calls that reset the prefix cache)."""

    num_gpu_blocks: int
    num_cpu_blocks: int
