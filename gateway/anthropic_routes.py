"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on chat's
machinery (vLLM's and SGLang's /v1/messages), so the `anthropic` SDK and the tools built on
it can point their base URL here.

The body becomes a chat prompt, SamplingParams and a tool plan
(gateway/anthropic_requests.py); the server's reasoning parser splits thinking off as on chat
(gateway/chat_reasoning.py); one `engine.generate` stream runs it, and
gateway/anthropic_output.py turns its events into the message object, whole or as SSE events
(`event: <type>` + `data: <json>`: message_start, content_block_start / _delta / _stop,
message_delta, message_stop). Errors are Anthropic's object (gateway/anthropic_errors.py)
with chat's statuses: a 400 naming the field, 404 for an unknown model, the engine's
rejection with its status; once a stream has started, an `error` event ends it. A client that
goes away aborts the request. The API key may come as `x-api-key`, as the SDK sends it.

count_tokens renders the same prompt and counts its tokens: `{"input_tokens": N}`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
from aiohttp import web
from troupe.gateway.anthropic_errors import MESSAGES_PATH, anthropic_error
from troupe.gateway.anthropic_output import MessageAssembler
from troupe.gateway.anthropic_requests import MessagesRequest, parse_count_tokens, parse_messages
from troupe.gateway.chat_reasoning import chat_reasoning, with_thinking_tags
from troupe.gateway.errors import ApiError, error_for_event
from troupe.gateway.http_body import read_json_body
from troupe.gateway.image_fetch import fetch_prompt_images
from troupe.gateway.outbox import Outbox
from troupe.gateway.sse_frames import typed_sse
from troupe.gateway.sse_writer import first_event, pump_sse, serve_sse
from troupe.gateway.state import GATEWAY, Gateway
from troupe.gateway.tokenize_routes import render_chat
from troupe.gateway.whole_answer import whole_answer
from troupe.messages import ChatPrompt, Delta, Finished, SamplingParams, StreamEvent

log = structlog.get_logger("troupe.gateway")

_json = msgspec.json.Encoder()


@dataclasses.dataclass(frozen=True)
class _Call:
    """A checked request and what answers it."""

    req: MessagesRequest
    params: SamplingParams  # the request's, with the reasoning parser's changes
    id: str
    assembler: MessageAssembler


async def messages(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    call = await _prepare(gateway, await read_json_body(request, gateway.settings))
    if not call.req.stream:
        body = await _answer(gateway, call)
        return web.json_response(body, dumps=lambda o: _json.encode(o).decode())
    gateway.stream_opened()
    try:
        events = gateway.engine.generate(call.req.prompt, call.params, request_id=call.id)
        first = await first_event(events, call.req.client_fields)

        async def fill(outbox: Outbox, on_overflow: Callable[[], None]) -> None:
            await _pump_events(events, first, call, outbox, on_overflow)

        return await serve_sse(request, gateway.settings, fill, call.id)
    finally:
        gateway.stream_closed()


async def count_tokens(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    model, chat = parse_count_tokens(await read_json_body(request, gateway.settings))
    gateway.served_models().lora_for(model)  # an adapter's name is fine: one tokenizer
    tokenizer = gateway.engine.tokenizer
    text = render_chat(tokenizer, chat)
    ids = await asyncio.to_thread(tokenizer.encode, text, False)  # as the tokenizer actor does
    return web.json_response({"input_tokens": len(ids)})


async def _prepare(gateway: Gateway, raw: bytes) -> _Call:
    engine = gateway.engine
    settings = gateway.settings
    tool_parser = settings.auto_tool_parser(engine.tokenizer.chat_template)
    req = parse_messages(raw, tool_parser=tool_parser, defaults=engine.sampling_defaults)
    fetched = await fetch_prompt_images(req.prompt, settings)  # http(s) images' bytes
    assert isinstance(fetched, ChatPrompt), "a ChatPrompt stays one"
    req = dataclasses.replace(req, prompt=fetched)
    served = gateway.served_models()
    req = req.with_lora(served.lora_for(req.model))
    message_id = f"msg_{uuid.uuid4().hex}"
    if req.user is not None:
        log.debug("request from a named user", request_id=message_id, user=req.user)
    parser = settings.reasoning_parser
    params = with_thinking_tags(parser, req.params, required=False)  # budget_tokens
    splitter, params, prompt = chat_reasoning(
        parser, engine.tokenizer, req.prompt, params, req.tools
    )
    assert isinstance(prompt, ChatPrompt), "a ChatPrompt stays one"
    req = dataclasses.replace(req, prompt=prompt)
    assembler = MessageAssembler(
        message_id, served.name_of(params.lora), req.tools, splitter, is_streaming=req.stream
    )
    return _Call(req, params, message_id, assembler)


async def _answer(gateway: Gateway, call: _Call) -> dict[str, Any]:
    def feed(event: Delta | Finished) -> dict[str, Any] | None:
        call.assembler.feed(event)
        return call.assembler.message

    req = call.req
    return await whole_answer(gateway, req.prompt, call.params, call.id, feed, req.client_fields)


async def _pump_events(
    events: Any,
    first: StreamEvent,
    call: _Call,
    outbox: Outbox,
    on_overflow: Callable[[], None],
) -> None:
    assembler = call.assembler
    for event in assembler.start(first):
        outbox.put(typed_sse(event))

    def encode(event: StreamEvent) -> list[str]:
        if isinstance(event, Delta | Finished):
            return [typed_sse(e) for e in assembler.feed(event)]
        return [typed_sse(anthropic_error(error_for_event(event, call.req.client_fields)))]

    def overflow_frames(error: ApiError) -> list[str]:
        return [typed_sse(anthropic_error(error))]

    await pump_sse(events, outbox, encode, first, on_overflow, overflow_frames)


def add_anthropic_routes(app: web.Application) -> None:
    app.router.add_post(MESSAGES_PATH, messages)
    app.router.add_post(f"{MESSAGES_PATH}/count_tokens", count_tokens)
