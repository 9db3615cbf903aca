"""Websocket client frames -> a typed command, or an error naming the field.

A frame is a JSON object: `{"type": "generate", "request_id", "prompt" | "messages", ...}`
with SamplingParams' own field names for the rest (structured output as on HTTP:
`response_format`, `structured_outputs` with a schema object, `guided_*`; with "messages", the
chat template's options as on /v1/chat/completions: `add_generation_prompt`,
`continue_final_message`, `chat_template_kwargs`), or `{"type": "cancel", "request_id"}`.
Nothing a client sends can raise out of `parse_frame`: every failure is a FrameError.

A frame's `model` means what it means over HTTP (the base model or a LoRA adapter): the session,
which knows what is served, resolves it with `Generate.on_model` (gateway/served_models.py).
SamplingParams' own `lora` names an adapter too; the two may not disagree.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from troupe.gateway.chat_messages import decode_chat_messages
from troupe.gateway.errors import ApiError
from troupe.gateway.openai_bodies import MAX_REQUEST_ID, convert_field, field_path, reason
from troupe.gateway.openai_requests import chat_prompt
from troupe.gateway.served_models import ServedModels
from troupe.gateway.structured_requests import (
    STRUCTURED_KEYS,
    StructuredFields,
    structured_outputs,
)
from troupe.messages import ChatMessage, ChatPrompt, ParamError, SamplingParams
from troupe.messages.sampling_defaults import NO_DEFAULTS, SamplingDefaults

_CHAT_OPTIONS = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs")
# frame keys that are not params
_RESERVED = ("type", "request_id", "model", "prompt", "messages", *_CHAT_OPTIONS)


class ChatOptions(msgspec.Struct, forbid_unknown_fields=True):
    """The chat template's options a frame with "messages" may carry (HTTP's defaults)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Generate:
    request_id: str
    prompt: str | list[int] | list[ChatMessage] | ChatPrompt
    params: SamplingParams
    # engine field -> the field the client wrote (structured output errors name the latter)
    client_fields: dict[str, str] = dataclasses.field(default_factory=dict)
    model: str | None = None  # as the frame wrote it: `on_model` resolves it

    def on_model(self, served: ServedModels) -> Generate:
        """This request on the adapter its `model` selects (as over HTTP); ApiError naming
        `model` when it is not served, or naming both when `lora` names another adapter."""
        lora = served.lora_for(self.model)
        if not self.model or lora == self.params.lora:  # no model given, or the same adapter
            return self
        if self.params.lora is not None:
            chosen = f"the adapter '{lora}'" if lora else f"the base model '{served.model_id}'"
            message = (
                f"'model' selects {chosen} but 'lora' names the adapter '{self.params.lora}':"
                " send one of them, or both naming the same adapter"
            )
            raise ApiError(400, message, param="lora")
        params = msgspec.structs.replace(self.params, lora=lora)
        return dataclasses.replace(self, params=params)


@dataclasses.dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclasses.dataclass(frozen=True)
class FrameError:
    """What to answer with: an error frame for `request_id` (None: about the socket)."""

    request_id: str | None
    message: str
    field: str | None = None
    code: str = "invalid_request"


def parse_frame(
    data: str, defaults: SamplingDefaults = NO_DEFAULTS
) -> Generate | Cancel | FrameError:
    """`defaults`: the engine's, for the sampling fields a frame leaves out (max_tokens apart:
    16, as SamplingParams and completions have it)."""
    try:
        frame = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        return FrameError(None, f"frame is not JSON: {exc}")
    except RecursionError:
        return FrameError(None, "frame is nested too deeply")
    if not isinstance(frame, dict):
        return FrameError(None, "a frame must be a JSON object")
    request_id = frame.get("request_id")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_REQUEST_ID:
        message = f"'request_id' must be a non-empty string of at most {MAX_REQUEST_ID} chars"
        return FrameError(None, message, "request_id")
    kind = frame.get("type")
    if kind == "cancel":
        return Cancel(request_id)
    if kind != "generate":
        shown = kind if isinstance(kind, str | None) else type(kind).__name__
        message = f"'type' must be 'generate' or 'cancel', got {shown!r:.40}"
        return FrameError(request_id, message, "type")
    try:
        model: str | None = convert_field(frame.get("model"), str | None, "model")
        return Generate(request_id, _prompt(frame), *_params(frame, defaults), model=model)
    except ApiError as exc:
        return FrameError(request_id, exc.message, exc.param)


def _prompt(frame: dict[str, Any]) -> str | list[int] | list[ChatMessage] | ChatPrompt:
    if ("prompt" in frame) == ("messages" in frame):
        raise ApiError(400, "send exactly one of 'prompt' or 'messages'", param="prompt")
    given = {key: frame[key] for key in _CHAT_OPTIONS if key in frame}
    if "messages" in frame:
        messages = decode_chat_messages(frame["messages"])
        options = convert_field(given, ChatOptions, "")
        return chat_prompt(
            messages,
            options.add_generation_prompt,
            options.continue_final_message,
            options.chat_template_kwargs,
        )
    for key in given:
        raise ApiError(400, f"'{key}' applies to 'messages', not 'prompt'", param=key)
    prompt: str | list[int] = convert_field(frame["prompt"], str | list[int], "prompt")
    return prompt


def _params(
    frame: dict[str, Any], defaults: SamplingDefaults
) -> tuple[SamplingParams, dict[str, str]]:
    fields = defaults.fill({k: v for k, v in frame.items() if k not in _RESERVED})
    if "bad_words_token_ids" in fields:  # the engine's tokenizer writes it from bad_words
        message = "'bad_words_token_ids' is filled by the server: send 'bad_words'"
        raise ApiError(400, message, param="bad_words_token_ids")
    structured = {k: fields.pop(k) for k in STRUCTURED_KEYS if k in fields}
    spec, client_fields = structured_outputs(convert_field(structured, StructuredFields, ""))
    try:
        params = msgspec.convert(fields, SamplingParams, str_keys=True)  # JSON: logit_bias
        if spec is not None:
            params = msgspec.structs.replace(params, structured_outputs=spec)
    except msgspec.ValidationError as exc:
        field = field_path(exc, "params")
        raise ApiError(400, f"invalid '{field}': {reason(exc)}", param=field) from None
    except RecursionError:
        raise ApiError(400, "a sampling field is nested too deeply", param="params") from None
    try:
        params.check()
    except ParamError as exc:
        field = client_fields.get(exc.field, exc.field)
        raise ApiError(400, str(exc), param=field) from None
    if params.num_samples > 1:  # frames name no sample: parallel sampling is HTTP's
        field = "n" if params.best_of is None else "best_of"
        raise ApiError(400, f"{field} > 1 is served on HTTP only, not the websocket", param=field)
    return params, client_fields
