"""A Responses request's `instructions` and `input` -> the chat messages its template renders.

    instructions                   ->  {"role": "system", ...} first
    "text"                         ->  {"role": "user", "content": "text"}
    message item                   ->  {"role": its role, "content": its text parts, joined}
    function_call item(s)          ->  an assistant message holding the calls, written in the
                                       format the model writes them (below), after the text of
                                       the assistant message just before them, if any
    function_call_output item      ->  {"role": "tool", "content": its output}
    reasoning item                 ->  nothing (templates drop earlier turns' thinking)

troupe's chat messages are role and text (the engine's ChatMessage), so a call goes into the
prompt as the text the model wrote for it: Hermes `<tool_call>` blocks, Llama 3's JSON
objects joined by `; `, or, where the template defines no format (tool_choice "required"),
the JSON array of calls the constraint makes the model write (gateway/tool_calls.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import convert_field
from troupe.gateway.responses_bodies import (
    ITEM_TYPES,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
)
from troupe.gateway.tool_auto import CLOSE, OPEN, ToolParserName

_TEXT_PARTS = ("input_text", "output_text")


def input_messages(
    input_: str | list[dict[str, Any]],
    instructions: str | None,
    call_format: ToolParserName | None,
    history: Sequence[dict[str, Any]] = (),
) -> list[dict[str, str]]:
    """The messages, or a 400 naming the item (`input[i]...`) that cannot be one. `history`:
    the items of the response that previous_response_id continues, read before `input` (after
    `instructions`: an earlier turn's are not carried over)."""
    messages: list[dict[str, str]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(input_, str):
        if not input_:
            raise invalid("input", "'input' must be a non-empty string or list of items")
        if not history:
            messages.append({"role": "user", "content": input_})
            return messages
        input_ = [{"role": "user", "content": input_}]
    if not input_:
        raise invalid("input", "'input' must be a non-empty string or list of items")
    calls: list[FunctionCallItem] = []  # the calls of the assistant turn being read
    said: dict[str, str] | None = None  # the assistant's text just before them, if any

    def flush_calls() -> None:
        if not calls:
            return
        text = calls_text(calls, call_format)
        if said is not None:
            content = said["content"].rstrip()  # the text before the calls, as chat shows it
            said["content"] = f"{content}\n{text}" if content else text
        else:
            messages.append({"role": "assistant", "content": text})
        calls.clear()

    for i, raw in enumerate([*history, *input_]):
        item = _item(raw, f"input[{i - len(history)}]")  # history's items were checked
        if isinstance(item, FunctionCallItem):
            calls.append(item)
            continue
        flush_calls()
        said = None
        if isinstance(item, MessageItem):
            message = {"role": item.role, "content": _text(item.content, f"input[{i}].content")}
            messages.append(message)
            said = message if item.role == "assistant" else None
        elif isinstance(item, FunctionCallOutputItem):
            output = _text(item.output, f"input[{i}].output")
            messages.append({"role": "tool", "content": output})
    flush_calls()
    return messages


def calls_text(calls: list[FunctionCallItem], call_format: ToolParserName | None) -> str:
    """The calls as the model writes them in `call_format` (None: tool_choice "required"'s
    JSON array)."""
    pairs = [(call.name, _arguments(call.arguments)) for call in calls]
    if call_format == "hermes":
        blocks = (json.dumps({"name": n, "arguments": a}, ensure_ascii=False) for n, a in pairs)
        return "\n".join(f"{OPEN}\n{block}\n{CLOSE}" for block in blocks)
    if call_format == "llama3_json":
        return "; ".join(
            json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in pairs
        )
    return json.dumps([{"name": n, "arguments": a} for n, a in pairs], ensure_ascii=False)


def _arguments(text: str) -> Any:
    """A call's arguments as JSON (the model wrote an object); text that is not JSON as is."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _item(raw: dict[str, Any], where: str) -> Any:
    kind = raw.get("type", "message")
    item_type = ITEM_TYPES.get(kind) if isinstance(kind, str) else None
    if item_type is None:
        served = ", ".join(ITEM_TYPES)
        raise invalid(f"{where}.type", f"{where}.type must be one of {served}, got {kind!r:.40}")
    return convert_field(raw, item_type, where)


def _text(content: str | list[ContentPart], where: str) -> str:
    """Content as one string: text parts joined; any other part is a 400 naming it."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type not in _TEXT_PARTS:
            kinds = " or ".join(_TEXT_PARTS)
            raise invalid(f"{where}[{j}]", f"{where}[{j}]: only text parts ({kinds}) are supported")
        if part.text is None:
            raise invalid(f"{where}[{j}].text", f"{where}[{j}].text must be a string")
        texts.append(part.text)
    return "".join(texts)
