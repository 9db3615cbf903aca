"""Turning what a caller passes to `Engine.generate` into a GenerateRequest."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from PIL import Image
from troupe.actors.core.chat_messages import ChatMessageError, check_chat_messages
from troupe.actors.core.content_parts import parts_of
from troupe.messages import (
    ChatMessage,
    ChatPrompt,
    GenerateRequest,
    ParamError,
    PromptEmbeds,
    SamplingParams,
)


class RequestInputError(ValueError):
    """The request is malformed; `field` names the part at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


_PATH = re.compile(r"at `\$\.?([A-Za-z_][\w]*)")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def _field_of(exc: msgspec.ValidationError, default: str) -> str:
    text = str(exc)
    match = _UNKNOWN.search(text) or _PATH.search(text)
    return match.group(1) if match else default


def to_sampling_params(params: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if isinstance(params, SamplingParams):
        return params
    if not isinstance(params, Mapping):
        raise RequestInputError("params", "params must be SamplingParams or a mapping")
    try:
        return msgspec.convert(dict(params), SamplingParams)
    except msgspec.ValidationError as exc:
        raise RequestInputError(
            _field_of(exc, "params"), f"invalid sampling params: {exc}"
        ) from exc


def check_params(params: SamplingParams, *, vocab_size: int | None) -> None:
    """The one check of sampling parameters before a request enters the graph (every client
    edge, and trace replay); RequestInputError names the field and its limit."""
    try:
        params.check(vocab_size=vocab_size)
    except ParamError as exc:
        raise RequestInputError(exc.field, str(exc)) from exc
    except (TypeError, ValueError) as exc:  # a struct built without validation (wrong types)
        raise RequestInputError("params", f"invalid sampling params: {exc}") from exc


def to_generate_request(
    request_id: str,
    prompt: Any,
    params: SamplingParams | Mapping[str, Any] | None,
    arrival_time: float,
    *,
    vocab_size: int | None = None,
) -> GenerateRequest:
    """Classify the prompt (text, chat messages, a ChatPrompt, token ids or PromptEmbeds: input
    embeddings, gpu/embed_rows.prompt_embeds_of), convert and check params.

    Every client edge (Engine.generate/submit, hence HTTP and the websocket) comes through
    here, so a request with bad parameters never enters the graph."""
    sampling = to_sampling_params(params)
    check_params(sampling, vocab_size=vocab_size)
    if isinstance(prompt, str):
        return GenerateRequest(
            request_id=request_id, params=sampling, arrival_time=arrival_time, prompt=prompt
        )
    if isinstance(prompt, PromptEmbeds):  # checked against the model by the tokenizer actor
        return GenerateRequest(
            request_id=request_id, params=sampling, arrival_time=arrival_time, prompt_embeds=prompt
        )
    if isinstance(prompt, Mapping) and "multi_modal_data" in prompt:
        text, images = _multimodal(prompt)
        return GenerateRequest(
            request_id=request_id,
            params=sampling,
            arrival_time=arrival_time,
            prompt=text,
            images=images,
        )
    if isinstance(prompt, ChatPrompt):
        check_chat_options(prompt)
        return GenerateRequest(
            request_id=request_id,
            params=sampling,
            arrival_time=arrival_time,
            messages=_chat_messages(prompt.messages),
            add_generation_prompt=prompt.add_generation_prompt,
            continue_final_message=prompt.continue_final_message,
            chat_template_kwargs=prompt.template_kwargs or None,
        )
    if not isinstance(prompt, Sequence):
        raise RequestInputError(
            "prompt", "prompt must be a string, a list of chat messages or a list of token ids"
        )
    items = list(prompt)
    # token ids: plain ints (a set of their types, at C speed: 3x the generator below at
    # 1,000 ids, which is still asked for int subclasses other than bool)
    if set(map(type, items)) <= {int} or all(
        isinstance(t, int) and not isinstance(t, bool) for t in items
    ):
        return GenerateRequest(
            request_id=request_id,
            params=sampling,
            arrival_time=arrival_time,
            prompt_token_ids=tuple(items),
        )
    return GenerateRequest(
        request_id=request_id,
        params=sampling,
        arrival_time=arrival_time,
        messages=_chat_messages(items),
    )


def _chat_messages(items: Sequence[Any]) -> tuple[ChatMessage, ...]:
    """ChatMessages, or dicts in OpenAI's shape (tool_calls with `arguments` text included);
    RequestInputError names the field at fault (`messages[2].tool_calls[0].function.name`)."""
    messages = []
    for index, item in enumerate(items):
        if isinstance(item, ChatMessage):
            messages.append(item)
            continue
        try:
            messages.append(_chat_message(item, index))
        except msgspec.ValidationError as exc:
            field = f"messages[{index}]{_message_path(exc)}"
            raise RequestInputError(field, f"{field} is invalid: {exc}") from exc
        except ChatMessageError as exc:
            raise RequestInputError(exc.field, str(exc)) from None
    try:
        check_chat_messages(messages)
    except ChatMessageError as exc:
        raise RequestInputError(exc.field, str(exc)) from None
    return tuple(messages)


def _multimodal(prompt: Mapping[str, Any]) -> tuple[str, tuple[bytes, ...]]:
    """vLLM's TextPrompt with images: {"prompt": text with the model's image placeholders,
    "multi_modal_data": {"image": an image or a list}}, each a file's bytes or a PIL image
    (saved as PNG, losslessly)."""
    unknown = set(prompt) - {"prompt", "multi_modal_data"}
    if unknown:
        raise RequestInputError(sorted(unknown)[0], f"unknown prompt field {sorted(unknown)[0]!r}")
    text, data = prompt.get("prompt"), prompt["multi_modal_data"]
    if not isinstance(text, str):
        raise RequestInputError("prompt", "a prompt with multi_modal_data must be a string")
    if not isinstance(data, Mapping) or set(data) - {"image"}:
        raise RequestInputError(
            "multi_modal_data", 'multi_modal_data takes "image" (one image or a list)'
        )
    given = data.get("image", [])
    images = given if isinstance(given, list | tuple) else [given]
    out = []
    for i, image in enumerate(images):
        if isinstance(image, bytes | bytearray):
            out.append(bytes(image))
            continue
        if not isinstance(image, Image.Image):
            raise RequestInputError(
                f"images[{i}]", f"images[{i}] must be an image file's bytes or a PIL image"
            )
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return text, tuple(out)


def _chat_message(item: Any, index: int) -> ChatMessage:
    """A dict in OpenAI's shape; content parts (text, image_url) as vLLM's LLM.chat takes
    them: the texts joined a line apart, and with images the parts in order."""
    content = item.get("content") if isinstance(item, dict) else None
    if not isinstance(content, list):
        return msgspec.convert(item, ChatMessage)
    parts = parts_of(content, f"messages[{index}].content")
    text = "\n".join(p.text for p in parts if p.type == "text")
    has_images = any(p.type == "image" for p in parts)
    message = msgspec.convert({**item, "content": text}, ChatMessage)
    return msgspec.structs.replace(message, parts=tuple(parts)) if has_images else message


_MESSAGE_PATH = re.compile(r" - at `\$([^`]*)`$")


def _message_path(exc: msgspec.ValidationError) -> str:
    """The path inside one message that msgspec's error names (`.tool_calls[0].id`)."""
    text = str(exc)
    match = _MESSAGE_PATH.search(text)
    path = match.group(1) if match else ""
    named = _UNKNOWN.search(text) or _MISSING.search(text)
    return f"{path}.{named.group(1)}" if named else path


# what the renderer passes itself (a template variable of these names would be overwritten)
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt"})


def check_chat_options(prompt: ChatPrompt) -> None:
    """The chat template's options hold together (RequestInputError names the field)."""
    if prompt.continue_final_message and prompt.add_generation_prompt:
        raise RequestInputError(
            "continue_final_message",
            "continue_final_message needs add_generation_prompt: false (the last message is "
            "continued, not answered)",
        )
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES & set(prompt.template_kwargs or ()))
    if reserved:
        raise RequestInputError(
            "chat_template_kwargs", f"chat_template_kwargs cannot set {', '.join(reserved)}"
        )
