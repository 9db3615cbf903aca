"""Chat request messages (openai_bodies.Message) -> the engine's ChatMessages, or a named 400.

The chat endpoint, the websocket and /tokenize take the same messages: text or text parts
(joined a line apart, as vLLM joins them for a template that takes a string), image parts
(`image_url` with a data URL: the parts then go to the template in order), an assistant's
`tool_calls` with null content, a tool result's `tool_call_id`, a returned answer's
`reasoning_content`. The rules of each role and the dicts the template gets
are the engine's (actors/core/chat_messages.py); here a break of them is a 400 naming the
field, as the client wrote it: `messages[2].tool_calls[0].function.arguments`.
"""

from __future__ import annotations

from typing import Any

from troupe.actors.core.chat_messages import ChatMessageError, check_chat_messages
from troupe.actors.core.content_parts import content_part
from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import ContentPart, ImageUrl, Message, convert_field
from troupe.messages import ChatMessage, ChatPart


def decode_chat_messages(messages: Any) -> list[ChatMessage]:
    """Decoded JSON (a websocket frame's `messages`) -> ChatMessages, or a named 400."""
    if not isinstance(messages, list):
        raise invalid("messages", "'messages' must be a non-empty list of messages")
    return chat_messages(convert_field(messages, list[Message], "messages"))


def chat_messages(messages: list[Message]) -> list[ChatMessage]:
    """Request messages -> ChatMessages (content parts joined by newlines), checked by the
    engine's rules; a 400 names the field that breaks one."""
    if not messages:
        raise invalid("messages", "'messages' must be a non-empty list of messages")
    out = [_chat_message(message, f"messages[{i}]") for i, message in enumerate(messages)]
    try:
        check_chat_messages(out)
    except ChatMessageError as exc:
        raise invalid(exc.field, str(exc)) from None
    return out


def _chat_message(message: Message, where: str) -> ChatMessage:
    content, parts = message.content, None
    if isinstance(content, list):
        parts = _parts(content, f"{where}.content")
        content = "\n".join(p.text for p in parts if p.type == "text")
        if all(p.type == "text" for p in parts):
            parts = None  # text alone: the joined string, as before
    reasoning = message.reasoning or message.reasoning_content  # vLLM reads them in this order
    if reasoning is not None and message.role != "assistant":
        field = f"{where}.reasoning_content" if message.reasoning is None else f"{where}.reasoning"
        raise invalid(field, f"{field}: only an assistant message carries its reasoning")
    return ChatMessage(
        role=message.role,
        content=content,
        tool_calls=None if message.tool_calls is None else tuple(message.tool_calls),
        tool_call_id=message.tool_call_id,
        name=message.name,
        reasoning=reasoning,
        parts=None if parts is None else tuple(parts),
    )


def _parts(parts: list[ContentPart], where: str) -> list[ChatPart]:
    """Content parts -> ChatParts in order (actors/core/content_parts.py reads each; the
    engine refuses images for a model that reads none, naming the part)."""
    out = []
    for j, part in enumerate(parts):
        image = part.image_url
        url = image.url if isinstance(image, ImageUrl) else image
        try:
            out.append(content_part(part.type, part.text, url, f"{where}[{j}]"))
        except ChatMessageError as exc:
            raise invalid(exc.field, str(exc)) from None
    return out
