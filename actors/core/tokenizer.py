"""TokenizerCore: client requests in, token ids out (or a rejection naming the bad field).

Per GenerateRequest, in inbox order:
    ok:     ("streamer", RequestOpened) then ("admission", TokenizedRequest)
    bad:    ("streamer", RequestRejected)              -- nothing goes to admission
AbortRequest is forwarded to admission unchanged, in order, so it never overtakes its request.
A whole batch is encoded with at most two `encode_batch` calls, one per setting of
add_special_tokens: a text prompt's default is with the model's special tokens, a rendered
chat's without (the template already wrote them); SamplingParams.add_special_tokens overrides it.

Long inputs (a client may send megabytes) cost little and harm nobody else's request:
- a text whose cheap lower bound on its token count (tokenizer_bound.py: its UTF-8 bytes and
  ASCII letters over the most of each one token can cover) reaches max_model_len is rejected
  TOO_LONG before any tokenizing, as are prompt_token_ids that long;
- a text over LONG_TEXT_CHARS is encoded on its own, in chunks, and dropped as TOO_LONG as soon
  as its count reaches max_model_len (tokenizer_chunks.py; ids identical to a whole encode).
  Long texts are encoded one at a time, so their encodings in memory are bounded by about
  max_model_len + one chunk of tokens, whatever the batch holds.
Text with a lone surrogate (possible through the Python API) is rejected, not handed to the
Rust tokenizer, which would raise. Any other exception while handling one request fails that
request alone (RequestFailed to the streamer): if it breaks a batch encode, the batch's texts
are encoded again one by one. The core runs in the actor's worker thread, off the loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import structlog
from troupe.actors.core.chat_messages import ChatMessageError, template_messages
from troupe.actors.core.chat_template import ChatTemplateError
from troupe.actors.core.embeds_check import checked_embeds
from troupe.actors.core.grammar_compiler import GrammarCompiler, GrammarError
from troupe.actors.core.image_decode import ImageError
from troupe.actors.core.prompt_images import PromptImages, ReadImage
from troupe.actors.core.tokenizer_bound import shared_count_bound
from troupe.actors.core.tokenizer_chunks import CHUNK_CHARS, ChunkedEncoder, LimitReached
from troupe.actors.core.tokenizer_params import (
    TruncationError,
    truncation_length,
    with_bad_words,
    with_thinking,
)
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.messages import (
    AbortRequest,
    ChatMessage,
    GenerateRequest,
    PromptEmbeds,
    PromptImage,
    RejectCode,
    RequestFailed,
    RequestOpened,
    RequestRejected,
    TokenizedRequest,
    TokenizerInbox,
)
from troupe.messages.prompt_embeds import PLACEHOLDER_TOKEN_ID

log = structlog.get_logger("troupe.tokenizer")

PROMPT_TAIL_LEN = 8  # prompt tokens handed to the streamer as detokenization context
LONG_TEXT_CHARS = CHUNK_CHARS  # longer texts are encoded alone, in chunks, up to the limit


@dataclass(frozen=True, slots=True)
class _Queued:
    """A text waiting in this batch's encode_batch call, with special tokens or without, for
    `field` ("prompt" or "messages")."""

    field: str
    special: bool
    index: int
    images: tuple[ReadImage, ...] = ()


@dataclass(frozen=True, slots=True)
class _Encoded:
    field: str
    ids: Sequence[int]
    embeds: PromptEmbeds | None = None  # an embeddings prompt: ids are its placeholders
    images: tuple[ReadImage, ...] = ()


class TokenizerCore:
    """Pure core of the Tokenizer actor. Deterministic given the tokenizer and the inbox."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        *,
        vocab_size: int | None = None,
        max_model_len: int | None = None,
        grammars: GrammarCompiler | None = None,
        prompt_embeds_width: int = 0,
        images: PromptImages | None = None,
    ) -> None:
        """`vocab_size`: the model's (embedding rows) if it differs from the tokenizer's.
        `max_model_len`: prompts that surely reach it are rejected before tokenizing (None:
        admission alone judges lengths). `grammars`: compiles structured-output specs here, so
        a bad one is rejected at the edge, naming its field (None: structured output refused).
        `prompt_embeds_width`: the hidden size of the embeddings prompts the runner takes
        (actors/core/embeds_check.py; 0: they are refused). `images`: reads the image
        parts of chat messages (actors/core/prompt_images.py; None: images are refused)."""
        self._images = images
        self._embeds_width = prompt_embeds_width
        self._grammars = grammars
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size if vocab_size is not None else tokenizer.vocab_size
        self._max_model_len = max_model_len
        self._bound = shared_count_bound(tokenizer)
        self._chunked = ChunkedEncoder(tokenizer.tokenizer)

    def handle(self, batch: Sequence[TokenizerInbox]) -> list[tuple[str, msgspec.Struct]]:
        """Tokenize a batch of requests; return (outbox, message) pairs in send order."""
        # Pass 1: decide what each request needs encoded (or why it is rejected).
        outcome: list[_Queued | _Encoded | RequestRejected | RequestFailed | None] = []
        queues: tuple[list[str], list[str]] = ([], [])  # by add_special_tokens: False, True
        for msg in batch:
            if isinstance(msg, GenerateRequest):
                try:
                    outcome.append(self._prepare(msg, queues))
                except Exception as exc:  # one bad request must not stop the tokenizer
                    outcome.append(_failed(msg, exc))
            else:
                outcome.append(None)
        encoded = tuple(
            self._encode_batch_isolated(texts, add_special_tokens=bool(special))
            for special, texts in enumerate(queues)
        )

        # Pass 2: emit in inbox order.
        out: list[tuple[str, msgspec.Struct]] = []
        for msg, result in zip(batch, outcome, strict=True):
            if isinstance(msg, AbortRequest):
                out.append(("admission", msg))
            elif isinstance(result, RequestRejected | RequestFailed):
                out.append(("streamer", result))
            else:
                assert result is not None, "a GenerateRequest always has an outcome"
                try:
                    out.extend(self._emit(msg, result, encoded))
                except Exception as exc:
                    out.append(("streamer", _failed(msg, exc)))
        return out

    def _encode_batch_isolated(
        self, texts: list[str], *, add_special_tokens: bool
    ) -> Sequence[Sequence[int] | Exception]:
        """encode_batch(texts); if it raises, each text alone, so only the texts that raise
        fail (their exception takes their place)."""
        if not texts:
            return []
        try:
            return self._tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        except Exception:
            encoded: list[Sequence[int] | Exception] = []
            for text in texts:
                try:
                    encoded += self._tokenizer.encode_batch(
                        [text], add_special_tokens=add_special_tokens
                    )
                except Exception as exc:
                    encoded.append(exc)
            return encoded

    def _emit(
        self,
        req: GenerateRequest,
        result: _Queued | _Encoded,
        encoded: tuple[Sequence[Sequence[int] | Exception], ...],
    ) -> list[tuple[str, msgspec.Struct]]:
        """What one request's encoding turns into: opened and admitted, or rejected (empty)."""
        field = result.field
        if isinstance(result, _Queued):
            ids = encoded[result.special][result.index]
            if isinstance(ids, Exception):
                raise ids
        else:
            ids = result.ids
        if not ids:
            return [("streamer", _reject(req, field, f"{field} encodes to no tokens"))]
        keep = truncation_length(req.params, self._max_model_len)  # checked in _prepare
        embeds = result.embeds if isinstance(result, _Encoded) else None
        kept = tuple(ids if keep is None else ids[-keep:])
        images: tuple[PromptImage, ...] = ()
        if result.images:
            assert self._images is not None
            try:
                images = self._images.place(kept, result.images, field)
            except ImageError as exc:
                return [("streamer", _reject(req, exc.field, str(exc)))]
        return self._accept(req, kept, embeds, images)

    def _prepare(
        self, req: GenerateRequest, queues: tuple[list[str], list[str]]
    ) -> _Queued | _Encoded | RequestRejected:
        """Queue the text to encode, or encode a long one now, or say why it is rejected."""
        spec = req.params.structured_outputs
        if spec is not None:
            if self._grammars is None:
                return _reject(req, "structured_outputs", "structured output is not available")
            try:
                self._grammars.compile(spec)  # cached: the grammar actor finds it compiled
            except GrammarError as exc:
                return _reject(req, exc.field, str(exc))
        try:
            keep = truncation_length(req.params, self._max_model_len)
        except TruncationError as exc:
            return _reject(req, "truncate_prompt_tokens", str(exc))
        if req.params.thinking_token_budget is not None and req.params.thinking_tags is None:
            why = (
                "thinking_token_budget needs thinking_tags, the texts that open and close thinking"
            )
            return _reject(req, "thinking_token_budget", why)
        given = [
            name
            for name in ("prompt", "messages", "prompt_token_ids", "prompt_embeds")
            if getattr(req, name) is not None
        ]
        if len(given) != 1:
            found = ", ".join(given) if given else "none"
            return _reject(
                req,
                "prompt",
                "exactly one of prompt, messages, prompt_token_ids, prompt_embeds must be set "
                f"(got {found})",
            )
        if req.prompt_embeds is not None:
            embeds = checked_embeds(
                req, width=self._embeds_width, max_model_len=self._max_model_len
            )
            if isinstance(embeds, tuple):
                code, field, message = embeds
                return RequestRejected(
                    request_id=req.request_id, code=code, field=field, message=message
                )
            return _Encoded("prompt_embeds", (PLACEHOLDER_TOKEN_ID,) * embeds.num_rows, embeds)
        if req.images and req.prompt is None:
            return _reject(req, "images", "images go with a text prompt (messages carry theirs)")
        if req.prompt is not None:
            if not req.prompt:
                return _reject(req, "prompt", "prompt must not be empty")
            if not req.images:
                return self._text(req, "prompt", req.prompt, queues, keep)
            if self._images is None:
                return _reject(req, "images", "images: this model takes no images")
            try:  # vLLM's multi_modal_data: the prompt writes the model's placeholders
                files = [(f"images[{i}]", data) for i, data in enumerate(req.images)]
                pictures = tuple(self._images.read_files(files, "images"))
                text = self._images.expand(req.prompt, len(pictures), "prompt")
            except ImageError as exc:
                return _reject(req, exc.field, str(exc))
            return self._text(req, "prompt", text, queues, keep, pictures)
        if req.messages is not None:
            if not req.messages:
                return _reject(req, "messages", "messages must not be empty")
            try:
                pictures = self._read_images(req.messages)
                text = self._tokenizer.render_chat(
                    template_messages(req.messages),
                    add_generation_prompt=req.add_generation_prompt,
                    continue_final_message=req.continue_final_message,
                    **(req.chat_template_kwargs or {}),
                )
                if pictures:
                    assert self._images is not None
                    text = self._images.expand(text, len(pictures))
            except ChatMessageError as exc:  # the edge checked it; a hand-built request may not
                return _reject(req, exc.field, str(exc))
            except ChatTemplateError as exc:
                return _reject(req, "messages", str(exc))
            except ImageError as exc:
                return _reject(req, exc.field, str(exc))
            return self._text(req, "messages", text, queues, keep, pictures)
        assert req.prompt_token_ids is not None
        if not req.prompt_token_ids:
            return _reject(req, "prompt_token_ids", "prompt_token_ids must not be empty")
        first = 0 if keep is None else max(len(req.prompt_token_ids) - keep, 0)
        num_ids = len(req.prompt_token_ids) - first
        if self._max_model_len is not None and num_ids >= self._max_model_len:
            return self._too_long(req, num_ids, exact=True)
        for position, token_id in enumerate(req.prompt_token_ids[first:], first):
            if not 0 <= token_id < self._vocab_size:
                return _reject(
                    req,
                    "prompt_token_ids",
                    f"prompt_token_ids[{position}] = {token_id} is outside the vocabulary "
                    f"[0, {self._vocab_size})",
                )
        return _Encoded("prompt_token_ids", req.prompt_token_ids)

    def _text(
        self,
        req: GenerateRequest,
        field: str,
        text: str,
        queues: tuple[list[str], list[str]],
        keep: int | None,
        images: tuple[ReadImage, ...] = (),
    ) -> _Queued | _Encoded | RequestRejected:
        """Check `text` cheaply; encode it now if long, else queue it for encode_batch. With
        `keep` (truncate_prompt_tokens) a long text is no error: it is encoded whole, cut later."""
        try:  # the Rust tokenizer raises TypeError on a lone surrogate: catch it here
            min_tokens = self._bound.min_tokens(text) if self._bound is not None else 0
            if self._bound is None and not text.isascii():
                text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return _reject(
                req,
                field,
                f"{field} is not valid Unicode text: lone surrogate {text[exc.start]!r} "
                f"at character {exc.start}",
            )
        limit = self._max_model_len if keep is None else None
        if limit is not None and min_tokens >= limit:
            return self._too_long(req, min_tokens, exact=False)
        special = req.params.add_special_tokens
        if special is None:
            special = field == "prompt"
        if len(text) > LONG_TEXT_CHARS:
            ids = self._chunked.encode(text, add_special_tokens=special, limit=limit)
            if isinstance(ids, LimitReached):
                return self._too_long(req, ids.num_tokens, exact=False)
            return _Encoded(field, ids, images=images)
        queue = queues[special]
        queue.append(text)
        return _Queued(field, special, len(queue) - 1, images)

    def _read_images(self, messages: Sequence[ChatMessage]) -> tuple[ReadImage, ...]:
        """The image parts of `messages`, read (none: ()); ImageError names the first part
        when the model takes no images."""
        for i, message in enumerate(messages):
            for j, part in enumerate(message.parts or ()):
                field = f"messages[{i}].content[{j}]"
                if part.type == "image" and self._images is None:
                    raise ImageError(field, "this model takes no images")
                if part.type == "image" and not part.image:
                    raise ImageError(
                        field, f"no image bytes (the engine fetches no URL: {part.url!r})"
                    )
        return () if self._images is None else tuple(self._images.read(messages))

    def _too_long(self, req: GenerateRequest, num_tokens: int, *, exact: bool) -> RequestRejected:
        # Admission's own length rejection, word for word (field "prompt" whatever the input
        # was), so clients see one shape however early the length is caught.
        count = f"{num_tokens}" if exact else f"at least {num_tokens}"
        return RequestRejected(
            request_id=req.request_id,
            code=RejectCode.TOO_LONG,
            field="prompt",
            message=f"prompt has {count} tokens; max_model_len is {self._max_model_len} "
            "(the prompt must leave room for at least one generated token)",
        )

    def _accept(
        self,
        req: GenerateRequest,
        ids: tuple[int, ...],
        embeds: PromptEmbeds | None = None,
        images: tuple[PromptImage, ...] = (),
    ) -> list[tuple[str, msgspec.Struct]]:
        params = with_thinking(self._tokenizer, with_bad_words(self._tokenizer, req.params), ids)
        opened = RequestOpened(
            request_id=req.request_id,
            params=params,
            num_prompt_tokens=len(ids),
            # an embeddings prompt's placeholders are no text to detokenize after
            prompt_tail_ids=() if embeds is not None else ids[-PROMPT_TAIL_LEN:],
            arrival_time=req.arrival_time,
            prompt_token_ids=ids if params.return_prompt_token_ids and embeds is None else None,
        )
        tokenized = TokenizedRequest(
            request_id=req.request_id,
            prompt_token_ids=ids,
            params=params,
            arrival_time=req.arrival_time,
            prompt_embeds=embeds,
            images=images,
        )
        return [("streamer", opened), ("admission", tokenized)]


def _failed(req: GenerateRequest, exc: Exception) -> RequestFailed:
    """An engine fault on this request (not the client's): it ends Failed, the others go on."""
    log.error("tokenizer failed on a request", request_id=req.request_id, exc_info=exc)
    message = f"tokenizer failed on this request: {type(exc).__name__}: {exc}"
    return RequestFailed(request_id=req.request_id, message=message)


def _reject(req: GenerateRequest, field: str, message: str) -> RequestRejected:
    return RequestRejected(
        request_id=req.request_id, code=RejectCode.INVALID_REQUEST, message=message, field=field
    )
