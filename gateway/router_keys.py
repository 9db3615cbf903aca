"""The text the router matches prefixes on, from an OpenAI request body.

Chat: each message as role, a unit separator, its text parts, a record separator, in order, so
two conversations share a key prefix exactly as far as they share leading messages (system
prompt, earlier turns). Completions: the prompt text; token ids become one character each
(behind a marker, so they never match text). Embeddings: their `input`, as a prompt (last-token
pooling keeps prefix-cache hits). Anything else keys on its JSON: it still gets a
replica, just no useful prefix.

A request that names a `model` (the base model or a LoRA adapter) or a `cache_salt` keys behind
one character for that pair: an engine shares cached blocks only among requests of one adapter
and salt, so their prompts should not follow each other's prefixes. One character, so that the
shared lead adds nothing worth counting to how much of a prompt a replica holds.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

_UNIT, _RECORD = "\x1f", "\x1e"
_IDS = "\x00ids\x00"
# Namespace characters: Unicode's private use area (6400 code points prompts rarely hold)
_NAMESPACE_BASE, _NUM_NAMESPACES = 0xE000, 6400


def routing_key(body: Any) -> str:
    """The prefix-matching key of a parsed /v1/completions, /v1/chat/completions or
    /v1/embeddings body."""
    if not isinstance(body, dict):
        return ""
    return _namespace(body) + _prompt_key(body)


def _namespace(body: dict[str, Any]) -> str:
    """One character for the body's (model, cache_salt); none when it names neither."""
    model, salt = body.get("model"), body.get("cache_salt")
    if not model and not salt:
        return ""
    digest = zlib.crc32(json.dumps([model, salt], default=str).encode())
    return chr(_NAMESPACE_BASE + digest % _NUM_NAMESPACES)  # a clash only merges two spaces


def _prompt_key(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        return "".join(_message_key(m) for m in messages)
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        return _IDS + "".join(chr(t) for t in prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return _prompt_key({"prompt": prompt[0]})
    return json.dumps(prompt, sort_keys=True, default=str)


def _message_key(message: Any) -> str:
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True, default=str) + _RECORD
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, in order
        content = "".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return f"{message.get('role', '')}{_UNIT}{content or ''}{_RECORD}"


def _is_token_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 0x110000
