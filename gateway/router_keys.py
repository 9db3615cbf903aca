"""The text the router matches prefixes on, from an OpenAI request body; each proxied endpoint
names the function that reads its prompt (gateway/router_app.py).

Chat (`messages_text`): each message as role, a unit separator, its text parts, a record
separator, in order, so two conversations share a key prefix exactly as far as they share
leading messages (system prompt, earlier turns). Responses (`responses_text`): `instructions`
as a system message, then `input` (a text as a user message, items in order: messages as
chat's, other items by their JSON), so a conversation keys alike on chat and on /v1/responses,
as its prompt renders alike; Anthropic's /v1/messages (`anthropic_text`) likewise, `system`
first. A prompt-like field (`field_text`: completions' `prompt`, embeddings' `input`, rerank's
`query`, score's `text_1`, SGLang /generate's and /encode's `text` or `input_ids`; SageMaker's
/invocations as the endpoint it names): its text; token ids become one character each (behind a
marker, so they never match text). A value of another shape keys on its JSON: it
still gets a replica, just no useful prefix.

A request that names a `model` (the base model or a LoRA adapter) or a `cache_salt` keys behind
one character for that pair: an engine shares cached blocks only among requests of one adapter
and salt, so their prompts should not follow each other's prefixes. One character, so that the
shared lead adds nothing worth counting to how much of a prompt a replica holds.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

from troupe.gateway.invocation_kind import InvocationKind, invocation_kind

# The prompt part of a body's key (the body is a JSON object)
KeyText = Callable[[dict[str, Any]], str]

_UNIT, _RECORD = "\x1f", "\x1e"
_IDS = "\x00ids\x00"
# Namespace characters: Unicode's private use area (6400 code points prompts rarely hold)
_NAMESPACE_BASE, _NUM_NAMESPACES = 0xE000, 6400


def routing_key(body: Any, text: KeyText) -> str:
    """The prefix-matching key of a parsed request body whose prompt `text` reads ("" for a
    body that is no JSON object: the replica answers its 400)."""
    if not isinstance(body, dict):
        return ""
    return _namespace(body) + text(body)


def messages_text(body: dict[str, Any]) -> str:
    """/v1/chat/completions: its `messages`."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return _json(messages)
    return "".join(_message_key(m) for m in messages)


def anthropic_text(body: dict[str, Any]) -> str:
    """/v1/messages (and its count_tokens): `system` as a system message, then `messages`, so
    a conversation keys alike here and on chat, as its prompt renders alike."""
    system = body.get("system")
    head = _message_key({"role": "system", "content": system}) if system else ""
    return head + messages_text(body)


def responses_text(body: dict[str, Any]) -> str:
    """/v1/responses: `instructions`, then `input`, as the chat messages they become."""
    instructions, input_ = body.get("instructions"), body.get("input")
    head = _message_key({"role": "system", "content": instructions}) if instructions else ""
    if isinstance(input_, str):
        return head + _message_key({"role": "user", "content": input_})
    if not isinstance(input_, list):
        return head + _json(input_)
    return head + "".join(_item_key(item) for item in input_)


def field_text(name: str) -> KeyText:
    """A prompt-like field: a text, token ids, or a list of one of those."""

    def text(body: dict[str, Any]) -> str:
        return _prompt_key(body.get(name))

    return text


def invocations_text(body: dict[str, Any]) -> str:
    """SageMaker's /invocations: as the endpoint its fields name (gateway/invocation_kind.py);
    a body that names none gets the replica's 400, so any key will do."""
    kind = invocation_kind(lambda name: body.get(name) is not None)
    return "" if kind is None else _INVOCATION_TEXT[kind](body)


def generate_text(body: dict[str, Any]) -> str:
    """SGLang's /generate: its `text`, else its `input_ids`."""
    return _prompt_key(body["text"] if body.get("text") is not None else body.get("input_ids"))


def _namespace(body: dict[str, Any]) -> str:
    """One character for the body's (model, cache_salt); none when it names neither."""
    model, salt = body.get("model"), body.get("cache_salt")
    if not model and not salt:
        return ""
    digest = zlib.crc32(json.dumps([model, salt], default=str).encode())
    return chr(_NAMESPACE_BASE + digest % _NUM_NAMESPACES)  # a clash only merges two spaces


def _prompt_key(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        return _IDS + "".join(chr(t) for t in prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return _prompt_key(prompt[0])
    return _json(prompt)


def _item_key(item: Any) -> str:
    """A Responses input item: a message (its `type` may be left out) as chat's; others (tool
    calls and outputs, reasoning) by their JSON, which a client sends back unchanged."""
    if isinstance(item, dict) and item.get("type", "message") == "message":
        return _message_key(item)
    return _json(item) + _RECORD


def _message_key(message: Any) -> str:
    if not isinstance(message, dict):
        return _json(message) + _RECORD
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, in order
        content = "\n".join(  # as the prompt joins them (gateway/chat_messages.py)
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return f"{message.get('role', '')}{_UNIT}{content or ''}{_RECORD}"


_INVOCATION_TEXT: dict[InvocationKind, KeyText] = {
    "chat": messages_text,
    "completion": field_text("prompt"),
    "input": field_text("input"),
    "score": field_text("text_1"),
    "rerank": field_text("query"),
}


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _is_token_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 0x110000
