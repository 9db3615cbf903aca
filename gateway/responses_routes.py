"""POST /v1/responses: OpenAI's Responses API on chat's machinery (vLLM's serving_responses).

The body becomes chat messages, SamplingParams and a tool plan (gateway/responses_requests.py);
the server's reasoning parser splits the answer as on chat (gateway/chat_reasoning.py); one
`engine.generate` stream runs it, and gateway/responses_output.py turns its events into output
items, whole or as SSE events (`event: <type>` + `data: <json>`, each with its
`sequence_number`, no `[DONE]`). A streamed answer ends with response.completed whatever its
status, as vLLM's does ("incomplete" with incomplete_details when max_output_tokens ran out),
so the client's stream helpers end it; an engine failure mid-stream is an `error` event.
Errors before the answer starts are chat's: a 400 naming the field, 404 for an unknown model,
the engine's rejection with its status. A client that goes away aborts the request.

`background: true` answers at once with the queued response object (and, with `stream`, follows
its events as GET ?stream=true does); the generation runs on in the app
(gateway/responses_background.py).

With `store` (and a server that stores responses), the answer is stored when the engine
finishes it (gateway/responses_store.py): the response object a streamed answer's
response.completed carries, the same JSON a whole answer is. An answer that never finishes
(its client went away, the engine failed, a reader too slow was cut off) is not stored, so a
stored response is always a finished one ("completed", or "incomplete" when
max_output_tokens ran out), never a fragment. GET/DELETE: gateway/responses_stored_routes.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
from aiohttp import web
from troupe.gateway.chat_reasoning import chat_reasoning
from troupe.gateway.errors import ApiError, error_for_event, invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.image_fetch import fetch_prompt_images
from troupe.gateway.outbox import Outbox
from troupe.gateway.responses_background import BackgroundRun
from troupe.gateway.responses_objects import ResponseShape
from troupe.gateway.responses_output import OutputAssembler
from troupe.gateway.responses_replay import serve_events
from troupe.gateway.responses_requests import ResponsesRequest, parse_responses
from troupe.gateway.responses_store import StoredResponse, new_response_id
from troupe.gateway.sse_frames import typed_sse
from troupe.gateway.sse_writer import first_event, pump_sse, serve_sse
from troupe.gateway.state import GATEWAY, Gateway
from troupe.gateway.whole_answer import whole_answer
from troupe.messages import (
    Delta,
    Finished,
    SamplingParams,
    StreamEvent,
)

log = structlog.get_logger("troupe.gateway")

_json = msgspec.json.Encoder()


async def responses(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    call = await _prepare(gateway, await read_json_body(request, gateway.settings))
    if call.req.is_background:
        return await _background(request, gateway, call)
    if not call.req.stream:
        body = await _answer(gateway, call)
        return web.json_response(body, dumps=lambda o: _json.encode(o).decode())
    gateway.stream_opened()
    try:
        events = gateway.engine.generate(call.req.prompt, call.params, request_id=call.id)
        first = await first_event(events, call.req.client_fields)

        async def fill(outbox: Outbox, on_overflow: Callable[[], None]) -> None:
            await _pump_events(events, first, call, outbox, on_overflow, gateway)

        return await serve_sse(request, gateway.settings, fill, call.id)
    finally:
        gateway.stream_closed()


async def responses_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to a Responses request body (an ApiError for a refused one);
    `stream: true` is refused by name: here there is no stream to answer on."""
    call = await _prepare(gateway, raw)
    if call.req.stream:
        raise invalid("stream", "stream is not served here: the answer is one whole JSON body")
    if call.req.is_background:
        raise invalid("background", "background is not served here: POST /v1/responses")
    return await _answer(gateway, call)


async def _background(request: web.Request, gateway: Gateway, call: _Call) -> web.StreamResponse:
    """Start the run; answer its queued object, or (stream) follow its events."""
    events = gateway.engine.generate(call.req.prompt, call.params, request_id=call.id)
    run = BackgroundRun(
        response_id=call.id,
        items=_json.encode(call.req.items),
        assembler=call.assembler,
        client_fields=call.req.client_fields,
    )
    queued = gateway.background.start(run, events)
    if call.req.stream:
        return await serve_events(request, run, [], -1)
    return web.json_response(queued, dumps=lambda o: _json.encode(o).decode())


@dataclasses.dataclass(frozen=True)
class _Call:
    """A checked request and what answers it."""

    req: ResponsesRequest
    params: SamplingParams  # the request's, with the reasoning parser's changes
    id: str
    assembler: OutputAssembler


async def _prepare(gateway: Gateway, raw: bytes) -> _Call:
    engine = gateway.engine
    settings = gateway.settings
    tool_parser = settings.auto_tool_parser(engine.tokenizer.chat_template)
    # Answers run to the end of the context unless capped (the engine clips at max_model_len;
    # the model's generation_config may cap them, as vLLM's max_new_tokens).
    defaults = engine.sampling_defaults
    req = parse_responses(
        raw,
        default_max_tokens=defaults.max_tokens_within(engine.max_model_len),
        tool_parser=tool_parser,
        store=gateway.responses,
        defaults=defaults,
    )
    req = dataclasses.replace(req, prompt=await fetch_prompt_images(req.prompt, settings))
    served = gateway.served_models()
    req = req.with_lora(served.lora_for(req.model))
    response_id = new_response_id(gateway.home_id)
    if req.user is not None:
        log.debug("request from a named user", request_id=response_id, user=req.user)
    parser = settings.reasoning_parser
    splitter, params, prompt = chat_reasoning(
        parser, engine.tokenizer, req.prompt, req.params, req.tools
    )
    req = dataclasses.replace(req, prompt=prompt)
    shape = ResponseShape(response_id, served.name_of(params.lora), req.echo)
    is_streaming = req.stream or req.is_background  # a background run keeps its events
    assembler = OutputAssembler(shape, req.tools, splitter, is_streaming=is_streaming)
    return _Call(req, params, response_id, assembler)


async def _answer(gateway: Gateway, call: _Call) -> dict[str, Any]:
    def feed(event: Delta | Finished) -> dict[str, Any] | None:
        call.assembler.feed(event)
        return call.assembler.response

    req = call.req
    body = await whole_answer(gateway, req.prompt, call.params, call.id, feed, req.client_fields)
    _keep(gateway, call)
    return body


def _keep(gateway: Gateway, call: _Call) -> None:
    """Store a finished answer when its request asked for it (and the server stores)."""
    store, response = gateway.responses, call.assembler.response
    if store is None or not call.req.is_stored or response is None:
        return
    entry = StoredResponse(
        response_id=call.id, response=_json.encode(response), items=_json.encode(call.req.items)
    )
    if not store.put(entry):
        log.info("response too large to store", request_id=call.id, num_bytes=entry.num_bytes)


async def _pump_events(
    events: Any,
    first: StreamEvent,
    call: _Call,
    outbox: Outbox,
    on_overflow: Callable[[], None],
    gateway: Gateway,
) -> None:
    assembler = call.assembler
    for event in assembler.start():
        outbox.put(typed_sse(event))

    def encode(event: StreamEvent) -> list[str]:
        if isinstance(event, Delta | Finished):
            frames = [typed_sse(e) for e in assembler.feed(event)]
            if isinstance(event, Finished):
                _keep(gateway, call)
            return frames
        error = error_for_event(event, call.req.client_fields)
        return [typed_sse(e) for e in assembler.fail(error)]

    def overflow_frames(error: ApiError) -> list[str]:
        return [typed_sse(e) for e in assembler.fail(error)]

    await pump_sse(events, outbox, encode, first, on_overflow, overflow_frames)
