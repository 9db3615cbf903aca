"""A Messages request's `system` and `messages` -> the chat messages its template renders.

    system (text or text blocks)         ->  {"role": "system", ...} first
    user: "text" / text blocks           ->  {"role": "user", "content": the texts, joined}
    user: image blocks among them        ->  the same, with the parts in order (base64 data
                                             decoded; a URL fetched by the route)
    user: tool_result blocks             ->  {"role": "tool", "tool_call_id": its tool_use_id,
                                             "content": its text}, one per block, in order
                                             (text blocks around them stay user messages)
    assistant: text, tool_use, thinking  ->  one {"role": "assistant", "content": the text,
                                             "tool_calls": [{"id", "function": {"name",
                                             "arguments": the input as JSON}}],
                                             "reasoning": the thinking}
    redacted_thinking                    ->  nothing

These are the messages a chat client sends for the same turns, so the template renders calls
and their results in the model's own format, as on chat and /v1/responses. A conversation
that ends with an assistant turn is continued (Anthropic's prefill: the answer goes on from
that text, as chat's continue_final_message). Document and the hosted tools' blocks are a 400
naming the block: this server reads text and images.
"""

from __future__ import annotations

import json
from typing import Any

from troupe.actors.core.chat_messages import ChatMessageError
from troupe.actors.core.content_parts import base64_image
from troupe.gateway.anthropic_bodies import (
    BLOCK_TYPES,
    Block,
    ImageBlock,
    InputMessage,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import convert_field
from troupe.messages import ChatMessage, ChatPart, ToolCall, ToolCallFunction

_BY_ROLE: dict[str, tuple[type[Block], ...]] = {
    "user": (TextBlock, ImageBlock, ToolResultBlock),
    "assistant": (TextBlock, ToolUseBlock, ThinkingBlock, RedactedThinkingBlock),
}


def chat_messages(
    system: str | list[TextBlock] | None, messages: list[InputMessage]
) -> list[ChatMessage]:
    """The chat messages, or a 400 naming the block (`messages[i].content[j]...`) that cannot
    be one."""
    if not messages:
        raise invalid("messages", "'messages' must hold at least one message")
    out: list[ChatMessage] = []
    if system:
        text = system if isinstance(system, str) else "\n".join(b.text for b in system)
        out.append(ChatMessage(role="system", content=text))
    for i, message in enumerate(messages):
        where = f"messages[{i}].content"
        if isinstance(message.content, str):
            out.append(ChatMessage(role=message.role, content=message.content))
            continue
        if not message.content:
            raise invalid(where, f"{where} must hold at least one content block")
        blocks = [
            _block(raw, f"{where}[{j}]", message.role) for j, raw in enumerate(message.content)
        ]
        if message.role == "user":
            out.extend(_user_turn(blocks, where))
        else:
            out.append(_assistant_turn(blocks))
    last = out[-1]
    if last.role == "assistant" and last.tool_calls:
        raise invalid(
            f"messages[{len(messages) - 1}]",
            "the last message is an assistant turn with tool_use blocks: send the calls' "
            "results (tool_result blocks) in a user message after it",
        )
    return out


def ends_with_assistant(messages: list[ChatMessage]) -> bool:
    """Whether the answer continues the last message (Anthropic's prefill)."""
    return messages[-1].role == "assistant"


def _block(raw: dict[str, Any], where: str, role: str) -> Block:
    kind = raw.get("type")
    block_type = BLOCK_TYPES.get(kind) if isinstance(kind, str) else None
    if block_type is None:
        served = ", ".join(BLOCK_TYPES)
        raise invalid(
            f"{where}.type",
            f"{where}.type must be one of {served} (this server reads text and images), got {kind!r:.40}",
        )
    if block_type not in _BY_ROLE[role]:
        raise invalid(f"{where}.type", f"{where}.type: a {role} message cannot hold a {kind} block")
    block: Block = convert_field(raw, block_type, where)
    return block


def _user_turn(blocks: list[Block], where: str) -> list[ChatMessage]:
    """A user message's blocks: its runs of text and image blocks as user messages (with
    images: their parts in order), each tool result as a tool message."""
    out: list[ChatMessage] = []
    parts: list[ChatPart] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            parts.append(ChatPart(type="text", text=block.text))
            continue
        if isinstance(block, ImageBlock):
            parts.append(_image(block, f"{where}[{j}].source"))
            continue
        assert isinstance(block, ToolResultBlock)
        if parts:
            out.append(_user_message(parts))
            parts = []
        content = _result_text(block.content, f"{where}[{j}].content")
        out.append(ChatMessage(role="tool", content=content, tool_call_id=block.tool_use_id))
    if parts:
        out.append(_user_message(parts))
    return out


def _user_message(parts: list[ChatPart]) -> ChatMessage:
    text = "\n".join(p.text for p in parts if p.type == "text")
    images = any(p.type == "image" for p in parts)
    return ChatMessage(role="user", content=text, parts=tuple(parts) if images else None)


def _image(block: ImageBlock, where: str) -> ChatPart:
    """An image block's part: base64 data decoded, a URL left for the route to fetch."""
    source = block.source
    if source.type == "url":
        if not source.url or not source.url.startswith(("http://", "https://")):
            raise invalid(f"{where}.url", f"{where}.url must be an http(s) URL")
        return ChatPart(type="image", url=source.url)
    try:
        return ChatPart(type="image", image=base64_image(source.data or "", f"{where}.data"))
    except ChatMessageError as exc:
        raise invalid(exc.field, str(exc)) from None


def _assistant_turn(blocks: list[Block]) -> ChatMessage:
    texts = [b.text for b in blocks if isinstance(b, TextBlock)]
    thinking = [b.thinking for b in blocks if isinstance(b, ThinkingBlock)]
    calls = tuple(
        ToolCall(
            id=b.id,
            function=ToolCallFunction(
                name=b.name, arguments=json.dumps(b.input, ensure_ascii=False)
            ),
        )
        for b in blocks
        if isinstance(b, ToolUseBlock)
    )
    return ChatMessage(
        role="assistant",
        content="\n".join(texts) if texts or not calls else None,
        tool_calls=calls or None,
        reasoning="\n".join(thinking) if thinking else None,
    )


def _result_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    """A tool result's content as one string: text blocks joined; any other a 400."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, raw in enumerate(content):
        if raw.get("type") != "text":
            raise invalid(
                f"{where}[{j}].type",
                f"{where}[{j}]: a tool result holds text blocks only (this server reads text), "
                f"got {raw.get('type')!r:.40}",
            )
        block: TextBlock = convert_field(raw, TextBlock, f"{where}[{j}]")
        texts.append(block.text)
    return "\n".join(texts)
