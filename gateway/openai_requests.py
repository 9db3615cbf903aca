"""OpenAI request bodies (completions and chat) -> prompt + SamplingParams, or a named 400."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

from troupe.gateway.errors import ApiError, invalid
from troupe.messages import ParamError, SamplingParams

Kind = Literal["completion", "chat"]

_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenAIRequest:
    """A checked request: what to run and how to answer."""

    kind: Kind
    model: str | None
    prompt: str | list[int] | list[dict[str, str]]
    params: SamplingParams
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk carrying usage


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) for x in v)


# field -> (check, what it must be). None is accepted for every field and means "default".
_Check = tuple[Callable[[Any], bool], str]
_COMMON: dict[str, _Check] = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "stream": (lambda v: isinstance(v, bool), "a boolean"),
    "stream_options": (lambda v: isinstance(v, dict), "an object"),
    "max_tokens": (_is_int, "an integer"),
    "temperature": (_is_number, "a number"),
    "top_p": (_is_number, "a number"),
    "top_k": (_is_int, "an integer"),
    "min_p": (_is_number, "a number"),
    "seed": (_is_int, "an integer"),
    "stop": (
        lambda v: (
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))
        ),
        "a string or a list of strings",
    ),
    "presence_penalty": (_is_number, "a number"),
    "frequency_penalty": (_is_number, "a number"),
    "repetition_penalty": (_is_number, "a number"),
    "n": (_is_int, "an integer"),
    "ignore_eos": (lambda v: isinstance(v, bool), "a boolean"),
    "stop_token_ids": (_is_int_list, "a list of integers"),
    "priority": (_is_int, "an integer"),
    "skip_special_tokens": (lambda v: isinstance(v, bool), "a boolean"),
    "include_stop_str_in_output": (lambda v: isinstance(v, bool), "a boolean"),
    "logit_bias": (lambda v: isinstance(v, dict) and not v, "empty (logit_bias is not supported)"),
    "user": (lambda v: isinstance(v, str), "a string"),
}
_COMPLETION: dict[str, _Check] = {
    **_COMMON,
    "prompt": (lambda v: True, "a string or token ids"),  # checked in _completion_prompt
    "logprobs": (_is_int, "an integer"),
    "echo": (lambda v: v is False, "false (echo is not supported)"),
    "best_of": (lambda v: v == 1, "1 (best_of is not supported)"),
    "suffix": (lambda v: False, "null (suffix is not supported)"),
}
_CHAT: dict[str, _Check] = {
    **_COMMON,
    "messages": (lambda v: True, "a list of messages"),  # checked in _chat_messages
    "max_completion_tokens": (_is_int, "an integer"),
    "logprobs": (lambda v: isinstance(v, bool), "a boolean"),
    "top_logprobs": (_is_int, "an integer"),
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"} (no JSON mode)'),
    "tools": (lambda v: v == [], "empty (tools are not supported)"),
    "tool_choice": (lambda v: v == "none", '"none" (tools are not supported)'),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "a boolean"),
    "store": (lambda v: isinstance(v, bool), "a boolean"),
    "metadata": (lambda v: isinstance(v, dict), "an object"),
}
# Fields passed to SamplingParams under the same name.
_PASSTHROUGH = (
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "ignore_eos", "priority", "skip_special_tokens",
    "include_stop_str_in_output",
)  # fmt: skip


def parse_request(kind: Kind, body: Any, *, default_max_tokens: int) -> OpenAIRequest:
    """Check a decoded JSON body; raise ApiError(400) naming the first bad field."""
    if not isinstance(body, dict):
        raise invalid("body", "request body must be a JSON object")
    fields = _COMPLETION if kind == "completion" else _CHAT
    for name, value in body.items():
        if name not in fields:
            raise invalid(name, f"unknown or unsupported field '{name}'")
        check, expected = fields[name]
        if value is not None and not check(value):
            raise invalid(name, f"'{name}' must be {expected}, got {value!r:.80}")
    if body.get("n") not in (None, 1):
        raise invalid("n", f"only n=1 is supported, got n={body['n']}")

    kw: dict[str, Any] = {k: body[k] for k in _PASSTHROUGH if body.get(k) is not None}
    max_tokens_field = "max_tokens"
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens_field = "max_completion_tokens"
    requested = body.get(max_tokens_field)
    kw["max_tokens"] = default_max_tokens if requested is None else requested
    stop = body.get("stop")
    if stop is not None:
        kw["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    if body.get("stop_token_ids"):
        kw["stop_token_ids"] = tuple(body["stop_token_ids"])

    logprobs_field = "logprobs"
    prompt: str | list[int] | list[dict[str, str]]
    if kind == "completion":
        prompt = _completion_prompt(body.get("prompt"))
        if body.get("logprobs") is not None:
            kw["logprobs"] = body["logprobs"]
    else:
        prompt = chat_messages(body.get("messages"))
        if body.get("top_logprobs") is not None and not body.get("logprobs"):
            raise invalid("top_logprobs", "top_logprobs needs logprobs: true")
        if body.get("logprobs"):
            kw["logprobs"] = body.get("top_logprobs") or 0
            logprobs_field = "top_logprobs" if body.get("top_logprobs") is not None else "logprobs"

    params = SamplingParams(**kw)
    try:
        params.check()
    except ParamError as exc:
        renamed = {"max_tokens": max_tokens_field, "logprobs": logprobs_field}
        raise invalid(renamed.get(exc.field, exc.field), str(exc)) from None

    stream_options = body.get("stream_options") or {}
    if stream_options and not body.get("stream"):
        raise invalid("stream_options", "stream_options needs stream: true")
    return OpenAIRequest(
        kind=kind,
        model=body.get("model"),
        prompt=prompt,
        params=params,
        stream=bool(body.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
    )


def _completion_prompt(prompt: Any) -> str | list[int]:
    if prompt is None:
        raise invalid("prompt", "'prompt' is required")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if _is_int_list(prompt):
            return list(prompt)
        if len(prompt) == 1 and (isinstance(prompt[0], str) or _is_int_list(prompt[0])):
            return prompt[0] if isinstance(prompt[0], str) else list(prompt[0])
        if len(prompt) > 1 and all(isinstance(p, str) or _is_int_list(p) for p in prompt):
            raise invalid("prompt", f"only one prompt per request is supported, got {len(prompt)}")
    raise invalid("prompt", "'prompt' must be a string, a list of token ids, or a list of one")


def chat_messages(messages: Any) -> list[dict[str, str]]:
    """Check OpenAI chat messages; content parts are joined into one string per message."""
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "'messages' must be a non-empty list of messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise invalid(where, f"{where} must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in _ROLES:
            raise invalid(f"{where}.role", f"{where}.role must be one of {', '.join(_ROLES)}")
        out.append({"role": role, "content": _content_text(message.get("content"), where)})
    return out


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}.content", f"{where}.content must be a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise invalid(
                f"{where}.content[{j}]", f"{where}.content[{j}]: only text parts are supported"
            )
        if not isinstance(part.get("text"), str):
            raise invalid(
                f"{where}.content[{j}].text", f"{where}.content[{j}].text must be a string"
            )
        texts.append(part["text"])
    return "".join(texts)


def api_error_for_model(model: str | None, served: str) -> ApiError | None:
    """404 for a model this server does not serve (None or '' means the served one)."""
    if model and model != served:
        message = f"model '{model}' does not exist; this server serves '{served}'"
        return ApiError(404, message, param="model", code="model_not_found")
    return None
