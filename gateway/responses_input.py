"""A Responses request's `instructions` and `input` -> the chat messages its template renders.

    instructions                   ->  {"role": "system", ...} first
    "text"                         ->  {"role": "user", "content": "text"}
    message item                   ->  {"role": its role, "content": its text parts, joined}
    function_call item(s)          ->  {"role": "assistant", "tool_calls": [{"id": call_id,
                                       "function": {"name", "arguments"}}, ...]}: the calls
                                       in a row make one message, whose content is the text
                                       of the assistant message just before them, if any
    function_call_output item      ->  {"role": "tool", "tool_call_id": its call_id,
                                       "content": its output}
    reasoning item                 ->  the `reasoning` of the assistant turn after it (its
                                       message or its calls; vLLM's reading), which a template
                                       renders where it keeps earlier thinking (Qwen3's after
                                       the last user message, GPT-OSS's on a call turn until an
                                       answer); thinking no turn follows is dropped

These are the messages a chat client sends for the same turns (the engine's ChatMessage), so
the template renders the calls in the model's own format, as on chat. vLLM makes one
assistant message per call; one message for the calls of a turn, beside its text, is the
turn as the model wrote it and as chat answers it. Arguments that are not a JSON object are a
400 naming the item, as on chat (actors/core/chat_messages.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from troupe.actors.core.chat_messages import ChatMessageError, tool_arguments
from troupe.actors.core.content_parts import content_part
from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import convert_field
from troupe.gateway.responses_bodies import (
    ITEM_TYPES,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
)
from troupe.messages import ChatMessage, ChatPart, ToolCall, ToolCallFunction

_TEXT_PARTS = ("input_text", "output_text")


def input_messages(
    input_: str | list[dict[str, Any]],
    instructions: str | None,
    history: Sequence[dict[str, Any]] = (),
) -> list[ChatMessage]:
    """The messages, or a 400 naming the item (`input[i]...`) that cannot be one. `history`:
    the items of the response that previous_response_id continues, read before `input` (after
    `instructions`: an earlier turn's are not carried over)."""
    messages: list[ChatMessage] = []
    if instructions:
        messages.append(ChatMessage(role="system", content=instructions))
    if isinstance(input_, str):
        if not input_:
            raise invalid("input", "'input' must be a non-empty string or list of items")
        if not history:
            messages.append(ChatMessage(role="user", content=input_))
            return messages
        input_ = [{"role": "user", "content": input_}]
    if not input_:
        raise invalid("input", "'input' must be a non-empty string or list of items")
    calls: list[ToolCall] = []  # the calls of the assistant turn being read
    said: ChatMessage | None = None  # the assistant message just before them, if any
    thought: str | None = None  # the reasoning items' text, for the turn that follows

    def flush_calls() -> None:
        nonlocal thought
        if not calls:
            return
        if said is not None:  # that message (the last one) and its calls are one turn
            messages[-1] = msgspec.structs.replace(said, tool_calls=tuple(calls))
        else:
            messages.append(
                ChatMessage(role="assistant", tool_calls=tuple(calls), reasoning=thought)
            )
            thought = None
        calls.clear()

    for i, raw in enumerate([*history, *input_]):
        where = f"input[{i - len(history)}]"
        item = _item(raw, where)  # history's items were checked
        if isinstance(item, FunctionCallItem):
            calls.append(_tool_call(item, where))
            continue
        flush_calls()
        said = None
        if isinstance(item, ReasoningItem):
            text = _thought(item, where)
            if text:
                thought = text if thought is None else f"{thought}\n{text}"
            continue
        if isinstance(item, MessageItem):
            parts = _image_parts(item.content, f"{where}.content")
            text = _text(item.content, f"{where}.content")
            if parts is not None and item.role != "assistant":
                messages.append(ChatMessage(role=item.role, content=text, parts=parts))
            elif item.role == "assistant":
                said = ChatMessage(role="assistant", content=text, reasoning=thought)
                messages.append(said)
            else:
                messages.append(ChatMessage(role=item.role, content=text))
        elif isinstance(item, FunctionCallOutputItem):
            output = _text(item.output, f"{where}.output")
            messages.append(ChatMessage(role="tool", content=output, tool_call_id=item.call_id))
        thought = None
    flush_calls()
    return messages


def _thought(item: ReasoningItem, where: str) -> str:
    """A reasoning item's text: its `reasoning_text` parts, joined (the summary is not the
    thinking); another part is a 400 naming it."""
    texts = []
    for j, part in enumerate(item.content or ()):
        at = f"{where}.content[{j}]"
        if part.get("type") != "reasoning_text" or not isinstance(part.get("text"), str):
            raise invalid(at, f"{at} must be a reasoning_text part with a string text")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_call(item: FunctionCallItem, where: str) -> ToolCall:
    """A function_call item as the call of a chat message, or a 400 naming its arguments."""
    try:
        tool_arguments(item.arguments, f"{where}.arguments")
    except ChatMessageError as exc:
        raise invalid(exc.field, str(exc)) from None
    function = ToolCallFunction(name=item.name, arguments=item.arguments)
    return ToolCall(id=item.call_id, function=function)


def _item(raw: dict[str, Any], where: str) -> Any:
    kind = raw.get("type", "message")
    item_type = ITEM_TYPES.get(kind) if isinstance(kind, str) else None
    if item_type is None:
        served = ", ".join(ITEM_TYPES)
        raise invalid(f"{where}.type", f"{where}.type must be one of {served}, got {kind!r:.40}")
    return convert_field(raw, item_type, where)


def _image_parts(content: str | list[ContentPart], where: str) -> tuple[ChatPart, ...] | None:
    """The parts of content that holds an `input_image`, in order (actors/core/content_parts.py
    reads each URL); None for content without one."""
    if isinstance(content, str) or all(part.type != "input_image" for part in content):
        return None
    out = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        try:
            if part.type == "input_image":
                out.append(content_part("image_url", None, part.image_url, at))
            elif part.type in _TEXT_PARTS:
                out.append(content_part("text", part.text, None, at))
        except ChatMessageError as exc:
            raise invalid(exc.field, str(exc)) from None
    return tuple(out)


def _text(content: str | list[ContentPart], where: str) -> str:
    """Content as one string: text parts joined (a user's images are read by _image_parts);
    any other part is a 400 naming it."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type == "input_image":
            continue
        if part.type not in _TEXT_PARTS:
            kinds = " or ".join(_TEXT_PARTS)
            raise invalid(f"{where}[{j}]", f"{where}[{j}]: only text parts ({kinds}) are supported")
        if part.text is None:
            raise invalid(f"{where}[{j}].text", f"{where}[{j}].text must be a string")
        texts.append(part.text)
    return "\n".join(texts)  # as chat's (gateway/chat_messages.py)
