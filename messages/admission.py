"""Inbox of Admission: tokenized requests, aborts, and the ends of requests it admitted."""

from __future__ import annotations

import msgspec
from troupe.messages.images import PromptImage
from troupe.messages.prompt_embeds import PromptEmbeds
from troupe.messages.sampling import SamplingParams
from troupe.messages.tokenizer import AbortRequest


class TokenizedRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_time: float
    # an embeddings prompt's rows (its prompt_token_ids are placeholders), digest set
    prompt_embeds: PromptEmbeds | None = None
    images: tuple[PromptImage, ...] = ()  # placeholders' images, in prompt order


class RequestsEnded(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """From the Streamer, batched: these requests reached their terminal event."""

    request_ids: tuple[str, ...]


AdmissionInbox = TokenizedRequest | AbortRequest | RequestsEnded
