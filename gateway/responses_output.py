"""One request's engine events -> the Responses API's output items and, streamed, the events
that build them (one state machine for both, so a streamed answer ends as the whole one; for
"auto" calls, below, where they may differ).

    [reasoning]  the reasoning parser's thinking            response.reasoning_text.delta ...
    [message]    the content (tool_choice "auto": the text  response.output_text.delta ...
                 around the calls)
    [function_call ...]  the calls                          response.function_call_arguments.*

Each item opens with response.output_item.added (a message or a reasoning item then adds its
one content part) and ends with its `.done` events and response.output_item.done; an item's
output_index is the number opened before it. The content goes through chat's tool-call
machinery: a named function streams its arguments as written; "required" calls are parsed
whole at the end, and a reply cut short is text, as on chat. "auto" whole: the text as it
comes, the calls parsed from the model's own format at the end. "auto" streamed: each call as
it is written (gateway/responses_calls.py): its item added (arguments ""), its arguments in
`.delta` pieces; the whole-reply parse at the end settles them (as chat's stream). Until a
call opens one item is open at a time; from then on the items open stay open (the parse may
still add to any call's arguments, and text the model writes between or after calls joins the
reply's one message, as in the whole answer) and all close at the end, in output_index order.
A reply that goes wrong after a call went out (cut by max_output_tokens, or not parsing)
closes its calls "incomplete" with the arguments sent, and its text never becomes a message
(whole, such a reply is its text): the response is "incomplete" (reason max_output_tokens)
when cut, else "completed", as chat's stream ends "length" or "stop". A message whose first
text comes after the calls (Hermes) follows them (whole, the message comes first). A message
item is made when there is content, or when there is nothing else to show.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from troupe.gateway.errors import ApiError
from troupe.gateway.reasoning import ReasoningSplitter
from troupe.gateway.responses_calls import responses_call_stream
from troupe.gateway.responses_objects import (
    ResponseShape,
    Status,
    function_call_item,
    message_item,
    new_id,
    output_text,
    reasoning_item,
    usage_object,
)
from troupe.gateway.tool_auto import AutoCallStream, auto_tool_stream
from troupe.gateway.tool_calls import ToolPlan, tool_calls
from troupe.gateway.tool_stream import (
    ArgumentsPiece,
    CallOpened,
    ContentPiece,
    StreamedCalls,
    StreamPiece,
)
from troupe.messages import Delta, Finished, FinishReason

Event = dict[str, Any]


@dataclasses.dataclass
class _Open:
    """The item being written: its kind, fields and text so far."""

    kind: str  # "message" | "reasoning" | "function_call"
    item_id: str
    index: int
    parts: list[str] = dataclasses.field(default_factory=list)
    call_id: str = ""
    name: str = ""


class OutputAssembler:
    """Feed it a request's Delta / Finished events; it keeps the output items and, when
    `is_streaming`, returns the Responses API events each one makes."""

    def __init__(
        self,
        shape: ResponseShape,
        tools: ToolPlan | None,
        splitter: ReasoningSplitter | None,
        *,
        is_streaming: bool,
    ) -> None:
        self.shape = shape
        self.output: list[dict[str, Any]] = []
        self.response: dict[str, Any] | None = None  # the whole response, once finished
        self._tools = tools
        self._splitter = splitter
        self._is_streaming = is_streaming
        self._auto: AutoCallStream | None = None  # "auto", whole: the calls at the end
        self._streamed: StreamedCalls | None = None  # "auto", streamed: calls as written
        if tools is not None and tools.spec is None and is_streaming:
            self._streamed = responses_call_stream(tools)
        elif tools is not None and tools.spec is None:
            self._auto = auto_tool_stream(tools.tools, tools.parser)
        self._call_text: list[str] = []  # "required" and named: what the model wrote
        self._open: list[_Open] = []  # in output_index order; several once a call streams
        self._calls: dict[int, _Open] = {}  # streamed calls' items, by the call's index
        self._is_trimming = False  # "auto" streamed: whitespace after a call is dropped
        self._events: list[Event] = []
        self._num_events = 0
        self._num_reasoning_tokens = 0
        self._num_held_tokens = 0  # reasoning or not: the splitter has not said yet
        self._spaces = ""  # "auto": whitespace held back (dropped before calls)

    # -- in -----------------------------------------------------------------------------------

    def start(self) -> list[Event]:
        """The stream's first events: the response, created and in progress."""
        body = self.shape.body("in_progress", [])
        self._emit("response.created", response=body)
        self._emit("response.in_progress", response=body)
        return self._drain()

    def feed(self, event: Delta | Finished) -> list[Event]:
        """The events `event` makes (none when not streaming)."""
        if self._splitter is not None:
            thought, event = self._splitter.split(event)
            self._count_reasoning(len(event.token_ids), bool(thought), bool(event.text))
            if thought:
                self._add_text("reasoning", thought)
        if event.text:
            self._content(event.text)
        if isinstance(event, Finished):
            self._finish(event)
        return self._drain()

    def output_so_far(self) -> list[dict[str, Any]]:
        """The output items as of now: those closed, then those being written, "in_progress"
        with their text so far (a running background response's GET)."""
        return [*self.output, *(_as_item(item, "in_progress") for item in self._open)]

    def fail(self, error: ApiError) -> list[Event]:
        """A stream that ends in an error (the engine's, or a reader too slow): OpenAI's
        `error` event."""
        self._emit("error", code=error.code, message=error.message, param=error.param)
        return self._drain()

    def _count_reasoning(self, num_tokens: int, thought: bool, said: bool) -> None:
        """The tokens of the deltas that carried thinking (a delta whose text the splitter
        held back, a tag maybe, counts with the next one that carries text)."""
        self._num_held_tokens += num_tokens
        if thought:
            self._num_reasoning_tokens += self._num_held_tokens
        if thought or said:
            self._num_held_tokens = 0

    # -- items ----------------------------------------------------------------------------------

    def _content(self, text: str) -> None:
        plan = self._tools
        if plan is None:
            self._add_text("message", text)
        elif self._streamed is not None:
            for piece in self._streamed.delta(text):
                self._piece(piece)
        elif self._auto is not None:
            self._show(self._auto.delta(text))
        else:
            self._call_text.append(text)
            if plan.name is not None:  # a named function: its arguments as they are written
                if not self._open or self._open[-1].kind != "function_call":
                    self._close_all("completed")
                    self._open_call(plan.name, new_id("call"))
                self._add_text("function_call", text)

    def _piece(self, piece: StreamPiece) -> None:
        """tool_choice "auto" streamed: what the call stream lets go out."""
        match piece:
            case ContentPiece(text=text):
                if self._is_trimming:  # as the whole parse strips the text around calls
                    text = text.lstrip()
                    self._is_trimming = not text
                if text:
                    self._show(text)
            case CallOpened(index=index, call_id=call_id, name=name):
                if not self._calls:  # the thinking is over; a message stays open
                    self._is_trimming = True
                    for item in [o for o in self._open if o.kind == "reasoning"]:
                        self._close(item, "completed")
                self._calls[index] = self._open_call(name, call_id)
            case ArgumentsPiece(index=index, text=text):
                self._write(self._calls[index], text)

    def _show(self, text: str) -> None:
        """tool_choice "auto": content to show, its trailing whitespace held back until more
        follows (calls after it drop it, as chat's whole answer strips it)."""
        body = text.rstrip()
        if body:
            self._add_text("message", self._spaces + body)
            self._spaces = ""
        self._spaces += text[len(body) :]

    def _finish(self, event: Finished) -> None:
        stopped = event.finish_reason == FinishReason.STOP
        last: Status = "completed" if stopped else "incomplete"  # the open items' end
        call_end: Status | None = None  # streamed calls' end, where not `last`
        calls: list[dict[str, Any]] = []  # whole calls, after the open items
        plan = self._tools
        if self._streamed is not None:
            call_end = self._finish_streamed(self._streamed, stopped)
        elif self._auto is not None:
            rest, calls = self._auto.finish(stopped)
            self._show(rest)
            if not calls and self._spaces:
                self._add_text("message", self._spaces)
        elif plan is not None:
            text = "".join(self._call_text)
            parsed = tool_calls(plan, text) if stopped else None
            if plan.name is not None:  # a named function's arguments, whole or not
                last = "completed" if parsed is not None else "incomplete"
            elif parsed is not None:  # "required": the calls, or (cut short) the text
                calls = parsed
            elif text:
                self._add_text("message", text)
        self._close_all(last, call_end)
        for call in calls:
            function = call["function"]
            item = self._open_call(function["name"], call["id"])
            self._write(item, function["arguments"])
            self._close(item, "completed")
        if not self.output:  # nothing said: an empty message, so there is one to read
            self._close(self._open_item("message"), last)
        status: Status = "completed" if stopped else "incomplete"
        usage = usage_object(event.usage, self._num_reasoning_tokens)
        self.response = self.shape.body(status, self.output, usage)
        self._emit("response.completed", response=self.response)

    def _finish_streamed(self, streamed: StreamedCalls, stopped: bool) -> Status:
        """The parse's last pieces (the calls not out yet, the rest of their arguments) or,
        no call having gone out, the held text; how the streamed calls end."""
        end = streamed.finish(stopped)
        for piece in end.pieces:
            self._piece(piece)
        if not self._calls:
            self._show(end.text)
            if self._spaces:
                self._add_text("message", self._spaces)
        return "completed" if end.is_calls else "incomplete"

    def _add_text(self, kind: str, text: str) -> None:
        """Write `text` into the open item of `kind` (opened here; before a call streams, the
        open item is closed first)."""
        item = next((o for o in self._open if o.kind == kind), None)
        if item is None:
            if not self._calls:
                self._close_all("completed")
            item = self._open_item(kind)
        self._write(item, text)

    def _write(self, item: _Open, text: str) -> None:
        item.parts.append(text)
        where = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == "message":
            self._emit(
                "response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]
            )
        elif item.kind == "reasoning":
            self._emit("response.reasoning_text.delta", **where, content_index=0, delta=text)
        else:
            self._emit("response.function_call_arguments.delta", **where, delta=text)

    def _open_item(self, kind: str) -> _Open:
        prefix = "msg" if kind == "message" else "rs"
        item = _Open(kind, new_id(prefix), len(self.output) + len(self._open))
        self._open.append(item)
        where = {"item_id": item.item_id, "output_index": item.index, "content_index": 0}
        if kind == "message":
            self._added(item, message_item(item.item_id, None, "in_progress"))
            self._emit("response.content_part.added", **where, part=output_text(""))
        else:
            self._added(item, reasoning_item(item.item_id, None, "in_progress"))
            part = {"type": "reasoning_text", "text": ""}
            self._emit("response.content_part.added", **where, part=part)
        return item

    def _open_call(self, name: str, call_id: str) -> _Open:
        index = len(self.output) + len(self._open)
        item = _Open("function_call", new_id("fc"), index, call_id=call_id, name=name)
        self._open.append(item)
        self._added(item, function_call_item(item.item_id, call_id, name, "", "in_progress"))
        return item

    def _added(self, item: _Open, body: dict[str, Any]) -> None:
        self._emit("response.output_item.added", output_index=item.index, item=body)

    def _close_all(self, status: Status, call_status: Status | None = None) -> None:
        """End the open items, in output_index order: `status`, or for function calls
        `call_status` when given."""
        for item in list(self._open):
            is_call = item.kind == "function_call"
            self._close(item, call_status if is_call and call_status is not None else status)

    def _close(self, item: _Open, status: Status) -> None:
        """End an open item with `status`; it joins the output."""
        self._open.remove(item)
        text = "".join(item.parts)
        where = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == "message":
            self._emit(
                "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
            )
            self._emit(
                "response.content_part.done", **where, content_index=0, part=output_text(text)
            )
        elif item.kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            self._emit("response.reasoning_text.done", **where, content_index=0, text=text)
            self._emit("response.content_part.done", **where, content_index=0, part=part)
        else:
            self._emit("response.function_call_arguments.done", **where, arguments=text)
        done = _as_item(item, status)
        self.output.append(done)
        self._emit("response.output_item.done", output_index=item.index, item=done)

    # -- out ------------------------------------------------------------------------------------

    def _emit(self, kind: str, **fields: Any) -> None:
        if self._is_streaming:
            self._events.append({"type": kind, "sequence_number": self._num_events, **fields})
            self._num_events += 1

    def _drain(self) -> list[Event]:
        events, self._events = self._events, []
        return events


def _as_item(item: _Open, status: Status) -> dict[str, Any]:
    """The output item `item` is, with its text so far and `status`."""
    text = "".join(item.parts)
    if item.kind == "message":
        return message_item(item.item_id, text, status)
    if item.kind == "reasoning":
        return reasoning_item(item.item_id, text, status)
    return function_call_item(item.item_id, item.call_id, item.name, text, status)
