"""TokenizerCore: client requests in, token ids out (or a rejection naming the bad field).

Per GenerateRequest, in inbox order:
    ok:     ("streamer", RequestOpened) then ("admission", TokenizedRequest)
    bad:    ("streamer", RequestRejected)              -- nothing goes to admission
AbortRequest is forwarded to admission unchanged, in order, so it never overtakes its request.
A whole batch is encoded with two `encode_batch` calls (prompts with the model's default special
tokens, rendered chats without: the template already wrote them).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from troupe.actors.core.chat_template import ChatTemplateError
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.messages import (
    AbortRequest,
    GenerateRequest,
    RejectCode,
    RequestOpened,
    RequestRejected,
    TokenizedRequest,
    TokenizerInbox,
)

PROMPT_TAIL_LEN = 8  # prompt tokens handed to the streamer as detokenization context


class TokenizerCore:
    """Pure core of the Tokenizer actor. Deterministic given the tokenizer and the inbox."""

    def __init__(self, tokenizer: TextTokenizer, *, vocab_size: int | None = None) -> None:
        """`vocab_size`: the model's (embedding rows) if it differs from the tokenizer's."""
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size if vocab_size is not None else tokenizer.vocab_size

    def handle(self, batch: Sequence[TokenizerInbox]) -> list[tuple[str, msgspec.Struct]]:
        """Tokenize a batch of requests; return (outbox, message) pairs in send order."""
        # Pass 1: decide what each request needs encoded (or why it is rejected).
        outcome: list[tuple[str, int] | RequestRejected | list[int] | None] = []
        prompts: list[str] = []
        chats: list[str] = []
        for msg in batch:
            if isinstance(msg, GenerateRequest):
                outcome.append(self._prepare(msg, prompts, chats))
            else:
                outcome.append(None)
        prompt_ids = self._tokenizer.encode_batch(prompts, add_special_tokens=True)
        chat_ids = self._tokenizer.encode_batch(chats, add_special_tokens=False)

        # Pass 2: emit in inbox order.
        out: list[tuple[str, msgspec.Struct]] = []
        for msg, result in zip(batch, outcome, strict=True):
            if isinstance(msg, AbortRequest):
                out.append(("admission", msg))
                continue
            if isinstance(result, RequestRejected):
                out.append(("streamer", result))
                continue
            if isinstance(result, tuple):
                source, index = result
                ids = prompt_ids[index] if source == "prompt" else chat_ids[index]
                field: str = source
            else:
                assert result is not None, "a GenerateRequest always has an outcome"
                ids, field = result, "prompt_token_ids"
            if not ids:
                out.append(("streamer", _reject(msg, field, f"{field} encodes to no tokens")))
                continue
            out.extend(self._accept(msg, tuple(ids)))
        return out

    def _prepare(
        self, req: GenerateRequest, prompts: list[str], chats: list[str]
    ) -> tuple[str, int] | RequestRejected | list[int]:
        """Queue the text to encode: ("prompt"|"messages", index), or ids, or a rejection."""
        given = [
            name
            for name in ("prompt", "messages", "prompt_token_ids")
            if getattr(req, name) is not None
        ]
        if len(given) != 1:
            found = ", ".join(given) if given else "none"
            return _reject(
                req,
                "prompt",
                f"exactly one of prompt, messages, prompt_token_ids must be set (got {found})",
            )
        if req.prompt is not None:
            if not req.prompt:
                return _reject(req, "prompt", "prompt must not be empty")
            prompts.append(req.prompt)
            return ("prompt", len(prompts) - 1)
        if req.messages is not None:
            if not req.messages:
                return _reject(req, "messages", "messages must not be empty")
            try:
                text = self._tokenizer.render_chat(
                    [{"role": m.role, "content": m.content} for m in req.messages],
                    add_generation_prompt=req.add_generation_prompt,
                )
            except ChatTemplateError as exc:
                return _reject(req, "messages", str(exc))
            chats.append(text)
            return ("messages", len(chats) - 1)
        assert req.prompt_token_ids is not None
        if not req.prompt_token_ids:
            return _reject(req, "prompt_token_ids", "prompt_token_ids must not be empty")
        for position, token_id in enumerate(req.prompt_token_ids):
            if not 0 <= token_id < self._vocab_size:
                return _reject(
                    req,
                    "prompt_token_ids",
                    f"prompt_token_ids[{position}] = {token_id} is outside the vocabulary "
                    f"[0, {self._vocab_size})",
                )
        return list(req.prompt_token_ids)

    def _accept(
        self, req: GenerateRequest, ids: tuple[int, ...]
    ) -> list[tuple[str, msgspec.Struct]]:
        opened = RequestOpened(
            request_id=req.request_id,
            params=req.params,
            num_prompt_tokens=len(ids),
            prompt_tail_ids=ids[-PROMPT_TAIL_LEN:],
            arrival_time=req.arrival_time,
        )
        tokenized = TokenizedRequest(
            request_id=req.request_id,
            prompt_token_ids=ids,
            params=req.params,
            arrival_time=req.arrival_time,
        )
        return [("streamer", opened), ("admission", tokenized)]


def _reject(req: GenerateRequest, field: str, message: str) -> RequestRejected:
    return RequestRejected(
        request_id=req.request_id, code=RejectCode.INVALID_REQUEST, message=message, field=field
    )
