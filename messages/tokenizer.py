"""Inbox of the Tokenizer: what clients send into the graph."""

from __future__ import annotations

import msgspec
from troupe.messages.common import ChatMessage
from troupe.messages.prompt_embeds import PromptEmbeds
from troupe.messages.sampling import SamplingParams


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A client's request. Exactly one of prompt, messages, prompt_token_ids, prompt_embeds
    is set."""

    request_id: str
    params: SamplingParams
    arrival_time: float  # engine monotonic clock, stamped at the edge
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    add_generation_prompt: bool = True  # messages only, as the three below (ChatPrompt's)
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, object] | None = None
    # input embeddings instead of tokens (EngineConfig.enable_prompt_embeds)
    prompt_embeds: PromptEmbeds | None = None
    # a text prompt's images (vLLM's multi_modal_data), their files' bytes in the order of
    # the prompt's image placeholders (chat messages carry theirs in their parts)
    images: tuple[bytes, ...] = ()


class AbortRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Stop a request wherever it is. Travels Tokenizer -> Admission -> Scheduler, in order
    behind the request it names, so it can never overtake it."""

    request_id: str
    reason: str = "client aborted"


TokenizerInbox = GenerateRequest | AbortRequest
