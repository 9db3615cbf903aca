"""The Responses API's objects: the response, its output items and its usage (OpenAI's shapes,
which the `openai` client's Response model parses)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from troupe.messages import Usage

Status = Literal["queued", "in_progress", "completed", "incomplete", "cancelled", "failed"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseShape:
    """One response's fixed fields (id, model, the request's settings) around its output."""

    def __init__(self, response_id: str, model: str, echo: dict[str, Any]) -> None:
        self.id = response_id
        self.model = model
        self.echo = echo
        self.created_at = int(time.time())

    def body(
        self,
        status: Status,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The response object; "incomplete" means max_output_tokens (or the context) ran out;
        `error` ({"code", "message"}) goes with "failed"."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "previous_response_id": None,
            "max_tool_calls": None,
            **self.echo,
            "usage": usage,
        }


def usage_object(usage: Usage, num_reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": num_reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: Status) -> dict[str, Any]:
    """An assistant message; `text` None: no content part yet (as a stream adds it)."""
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [output_text(text)],
    }


def reasoning_item(item_id: str, text: str | None, status: Status) -> dict[str, Any]:
    """The answer's thinking (a reasoning parser's), as vLLM's `reasoning_text` content."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: Status
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
