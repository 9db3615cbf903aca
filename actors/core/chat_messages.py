"""Chat messages with tool calls: the rules every edge checks, and the dicts a template sees.

An agent's turn, as OpenAI's API carries it:

    {"role": "assistant", "content": null,
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}]}
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 C"}

The template gets each message as a dict, built the way vLLM builds it for HF's
`apply_chat_template` (vllm/entrypoints/chat_utils.py, string content format), so a template
renders here what it renders there:

- `content` is always a string: a message without content renders with `""` (vLLM turns a
  null content into no parts, joined: `""`), so `message.content` never prints as `None`;
- a key the client left out is absent, never None: `tool_calls` only on an assistant message
  that makes calls (an empty list is dropped, as vLLM drops it, so the template takes its plain
  assistant path), `tool_call_id` and `name` only where sent. Llama 3.1's template tests
  `'tool_calls' in message`, so a None key would send a plain answer down the call path;
- each call's `arguments` is parsed into a dict (templates such as Qwen2.5/Qwen3's and Llama
  3.1's `tojson` them; HF's documented form). vLLM coerces text that is not a JSON object to
  `{}` with a warning; troupe refuses it at the edge instead, naming the field, so the prompt
  never silently loses a call's arguments (an empty string is `{}`, as in vLLM);
- an assistant's `reasoning` (the thinking an earlier turn returned as `reasoning_content`)
  goes in as both `reasoning` and `reasoning_content`, as vLLM passes it (Qwen3's template
  reads the latter), and as `thinking`, the name GPT-OSS's template reads (it renders a call
  turn's thinking until a later answer, as vLLM's harmony rendering keeps it);
- a message with images (`parts`) gets its content as a list of parts, `{"type": "image"}`
  and `{"type": "text", "text": ...}` in order (vLLM's "openai" content format), which the
  templates of image-taking models iterate to write each image's placeholder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from troupe.messages import ChatMessage


class ChatMessageError(ValueError):
    """A message breaks a rule of its role; `field` names it (`messages[2].tool_calls`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_chat_messages(messages: Sequence[ChatMessage], where: str = "messages") -> None:
    """Raise ChatMessageError naming the first message field that breaks a rule: content left
    out without tool calls, tool calls on a message that is not the assistant's, a
    `tool_call_id` on one that is not a tool's, `arguments` that are not a JSON object."""
    for i, message in enumerate(messages):
        at = f"{where}[{i}]"
        if message.tool_calls is not None and message.role != "assistant":
            raise ChatMessageError(
                f"{at}.tool_calls",
                f"{at}.tool_calls: only an assistant message makes tool calls, this one's role "
                f"is {message.role!r}",
            )
        if message.tool_call_id is not None and message.role != "tool":
            raise ChatMessageError(
                f"{at}.tool_call_id",
                f"{at}.tool_call_id: only a tool message answers a call, this one's role is "
                f"{message.role!r}",
            )
        if message.content is None and not message.tool_calls:
            raise ChatMessageError(
                f"{at}.content",
                f"{at}.content is missing: only an assistant message with tool_calls may leave "
                "it out",
            )
        for j, call in enumerate(message.tool_calls or ()):
            tool_arguments(call.function.arguments, f"{at}.tool_calls[{j}].function.arguments")


def tool_arguments(text: str, field: str) -> dict[str, Any]:
    """A call's `arguments` text as the dict the template gets ("" is {}, as in vLLM), or
    ChatMessageError naming `field`."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ChatMessageError(field, f"{field} must be a JSON object's text: {exc}") from None
    if not isinstance(value, dict):
        kind = type(value).__name__
        raise ChatMessageError(field, f"{field} must be a JSON object's text, got a JSON {kind}")
    return value


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The dicts the chat template renders (the module's rules, vLLM's key order); raises
    ChatMessageError where a call's arguments do not parse."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {"role": message.role, "content": message.content or ""}
        if message.parts is not None:  # with images: the parts in order, as vLLM passes them
            entry["content"] = [
                {"type": "image"} if part.type == "image" else {"type": "text", "text": part.text}
                for part in message.parts
            ]
        if message.role == "assistant":
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": call.type,
                        "function": {
                            "name": call.function.name,
                            "arguments": tool_arguments(
                                call.function.arguments,
                                f"messages[{i}].tool_calls[{j}].function.arguments",
                            ),
                        },
                    }
                    for j, call in enumerate(message.tool_calls)
                ]
            if message.reasoning is not None:
                entry["reasoning"] = entry["reasoning_content"] = message.reasoning
                entry["thinking"] = message.reasoning
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            entry["name"] = message.name
        out.append(entry)
    return out
