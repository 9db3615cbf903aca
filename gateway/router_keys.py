"""The text the router matches prefixes on, from an OpenAI request body.

Chat: each message as role, a unit separator, its text parts, a record separator, in order, so
two conversations share a key prefix exactly as far as they share leading messages (system
prompt, earlier turns). Completions: the prompt text; token ids become one character each
(behind a marker, so they never match text). Embeddings: their `input`, as a prompt (last-token
pooling keeps prefix-cache hits). Anything else keys on its JSON: it still gets a
replica, just no useful prefix.
"""

from __future__ import annotations

import json
from typing import Any

_UNIT, _RECORD = "\x1f", "\x1e"
_IDS = "\x00ids\x00"


def routing_key(body: Any) -> str:
    """The prefix-matching key of a parsed /v1/completions, /v1/chat/completions or
    /v1/embeddings body."""
    if not isinstance(body, dict):
        return ""
    messages = body.get("messages")
    if isinstance(messages, list):
        return "".join(_message_key(m) for m in messages)
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        return _IDS + "".join(chr(t) for t in prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return routing_key({"prompt": prompt[0]})
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
