"""One request's engine events -> Anthropic's message object and, streamed, its events.

The content is settled by the Responses API's OutputAssembler (gateway/responses_output.py),
which owns the reasoning split and chat's tool-call machinery; its items are Anthropic's
content blocks one for one, so this module only renames:

    Responses item / event                  Anthropic block / event
    reasoning                               {"type": "thinking", "thinking", "signature": ""}
    message                                 {"type": "text", "text"}
    function_call                           {"type": "tool_use", "id": call_id, "name",
                                             "input": the arguments, parsed}
    response.output_item.added              content_block_start (index = output_index)
    response.{output_text, reasoning_text,  content_block_delta: text_delta, thinking_delta,
      function_call_arguments}.delta          input_json_delta (partial_json)
    response.output_item.done               content_block_stop
    response.completed                      message_delta (stop_reason, usage), message_stop

A stream opens with message_start (the message with no content, the prompt's tokens as
input_tokens). stop_reason: "max_tokens" when max_tokens (or the context) ran out, "tool_use"
when the answer made calls, "stop_sequence" (with the one that matched) when a stop sequence
ended it, else "end_turn". Usage as Anthropic counts it: `input_tokens` are the prompt tokens
not read from the prefix cache, `cache_read_input_tokens` the others. A call's arguments that
do not parse (cut short by max_tokens) are the whole answer's `input: {}`; streamed, the
client got them as they came.
"""

from __future__ import annotations

import json
from typing import Any

from troupe.gateway.reasoning import ReasoningSplitter
from troupe.gateway.responses_objects import ResponseShape
from troupe.gateway.responses_output import OutputAssembler
from troupe.gateway.tool_calls import ToolPlan
from troupe.messages import Delta, Finished, FinishReason, StreamEvent

Event = dict[str, Any]
_DELTAS = {
    "response.output_text.delta": ("text_delta", "text"),
    "response.reasoning_text.delta": ("thinking_delta", "thinking"),
    "response.function_call_arguments.delta": ("input_json_delta", "partial_json"),
}


class MessageAssembler:
    """Feed it a request's Delta / Finished events; `message` is the answer once finished.
    When `is_streaming`, each call returns the Anthropic events it makes."""

    def __init__(
        self,
        message_id: str,
        model: str,
        tools: ToolPlan | None,
        splitter: ReasoningSplitter | None,
        *,
        is_streaming: bool,
    ) -> None:
        self.message_id = message_id
        self.model = model
        self.message: Event | None = None
        self._items = OutputAssembler(
            ResponseShape(message_id, model, {}), tools, splitter, is_streaming=is_streaming
        )

    def start(self, first: StreamEvent) -> list[Event]:
        """The stream's first event: the empty message (`first`: the request's first event,
        which carries the prompt's token count)."""
        if isinstance(first, Delta):
            num_prompt = first.prompt_tokens or 0
        else:
            num_prompt = first.usage.prompt_tokens if isinstance(first, Finished) else 0
        usage = {"input_tokens": num_prompt, "output_tokens": 0}
        return [{"type": "message_start", "message": self._body([], None, None, usage)}]

    def feed(self, event: Delta | Finished) -> list[Event]:
        out = [_renamed(e) for e in self._items.feed(event)]
        if isinstance(event, Finished):
            self.message = self._finish(event)
            delta = {k: self.message[k] for k in ("stop_reason", "stop_sequence")}
            out.append({"type": "message_delta", "delta": delta, "usage": self.message["usage"]})
            out.append({"type": "message_stop"})
        return [e for e in out if e]

    def _finish(self, event: Finished) -> Event:
        blocks = [_block(item) for item in self._items.output]
        if event.finish_reason == FinishReason.LENGTH:
            reason, sequence = "max_tokens", None
        elif any(b["type"] == "tool_use" for b in blocks):
            reason, sequence = "tool_use", None
        elif isinstance(event.stop_reason, str):
            reason, sequence = "stop_sequence", event.stop_reason
        else:
            reason, sequence = "end_turn", None
        usage = event.usage
        counts = {
            "input_tokens": usage.prompt_tokens - usage.cached_tokens,
            "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": usage.cached_tokens,
        }
        return self._body(blocks, reason, sequence, counts)

    def _body(
        self, content: list[Event], reason: str | None, sequence: str | None, usage: Event
    ) -> Event:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage,
        }


def _renamed(event: Event) -> Event:
    """The Anthropic event a Responses event is ({} where it has none)."""
    kind = event["type"]
    if kind in _DELTAS:
        delta_type, key = _DELTAS[kind]
        delta = {"type": delta_type, key: event["delta"]}
        return {"type": "content_block_delta", "index": event["output_index"], "delta": delta}
    if kind == "response.output_item.added":
        item = event["item"]
        start = {"type": "content_block_start", "index": event["output_index"]}
        if item["type"] == "message":
            return {**start, "content_block": {"type": "text", "text": ""}}
        if item["type"] == "reasoning":
            return {**start, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
        block = {"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": {}}
        return {**start, "content_block": block}
    if kind == "response.output_item.done":
        return {"type": "content_block_stop", "index": event["output_index"]}
    return {}


def _block(item: Event) -> Event:
    """The content block an output item is."""
    if item["type"] == "message":
        return {"type": "text", "text": item["content"][0]["text"] if item["content"] else ""}
    if item["type"] == "reasoning":
        text = item["content"][0]["text"] if item["content"] else ""
        return {"type": "thinking", "thinking": text, "signature": ""}
    try:
        arguments = json.loads(item["arguments"]) if item["arguments"] else {}
    except ValueError:
        arguments = {}
    if not isinstance(arguments, dict):
        arguments = {}
    return {"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": arguments}
