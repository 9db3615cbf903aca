"""POST /v1/completions and /v1/chat/completions (JSON or SSE), GET /v1/models."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, cast

import msgspec
import structlog
from aiohttp import web
from troupe.gateway.beam_routes import beam_answer, beam_body, beam_result
from troupe.gateway.chat_reasoning import chat_reasoning, with_thinking_tags
from troupe.gateway.chat_tool_chunks import call_stream, tool_call_chunks
from troupe.gateway.engine_api import EngineLike
from troupe.gateway.errors import ApiError, error_for_event, invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.image_fetch import fetch_prompt_images
from troupe.gateway.openai_bodies import MAX_REQUEST_ID
from troupe.gateway.openai_requests import Kind, OpenAIRequest, parse_request
from troupe.gateway.openai_responses import ResponseBuilder
from troupe.gateway.outbox import Outbox
from troupe.gateway.prompt_batch import batch_events, batch_usage
from troupe.gateway.prompt_embeds_body import decoded_embeds, prompt_names
from troupe.gateway.prompt_logprobs import Echo, PromptLogprobsSeen, echo_for
from troupe.gateway.reasoning import ReasoningSplitter
from troupe.gateway.sse_frames import DONE as _DONE
from troupe.gateway.sse_frames import sse as _sse
from troupe.gateway.sse_frames import text_delta_frames
from troupe.gateway.sse_writer import first_event, pump_sse, serve_sse
from troupe.gateway.state import GATEWAY, Gateway
from troupe.gateway.token_ids_out import TokenIds, chunk_with_ids
from troupe.gateway.tool_auto import parse_auto_calls
from troupe.gateway.tool_calls import tool_calls
from troupe.messages import (
    Aborted,
    ChatMessage,
    ChatPrompt,
    Delta,
    Failed,
    Finished,
    PromptEmbeds,
    Rejected,
    StreamEvent,
    TokenLogprob,
    Usage,
)

log = structlog.get_logger("troupe.gateway")

_json = msgspec.json.Encoder()


async def completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, "chat")


async def completions_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to a completions request body (an ApiError for a refused one)."""
    return await _answer_json(gateway, "completion", raw)


async def chat_body(gateway: Gateway, raw: bytes) -> dict[str, Any]:
    """The JSON answer to a chat completions request body (an ApiError for a refused one)."""
    return await _answer_json(gateway, "chat", raw)


async def _answer_json(gateway: Gateway, kind: Kind, raw: bytes) -> dict[str, Any]:
    """What a non-streaming request is answered with (gateway/json_calls.py runs it without
    HTTP); `stream: true` is refused by name: here there is no stream to answer on."""
    call = await _prepare(gateway, kind, raw)
    if call.req.stream:
        raise invalid("stream", "stream is not served here: the answer is one whole JSON body")
    return await _answer(gateway, call)


async def _handle(request: web.Request, kind: Kind) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    raw = await read_json_body(request, gateway.settings)
    call = await _prepare(gateway, kind, raw, request.headers.get("X-Request-Id"))
    if not call.req.stream:
        body = await _answer(gateway, call)
        return web.json_response(body, dumps=lambda o: _json.encode(o).decode())
    req, builder, engine = call.req, call.builder, gateway.engine
    gateway.stream_opened()
    try:
        if req.beam is not None:  # vLLM's use_beam_search: answered when the beams are known
            return await beam_answer(request, engine, req, builder, call.echo)
        events = _events(engine, call, call.engine_id)
        return await _stream(request, gateway, events, builder, req, call.echo, call.splitter)
    finally:
        gateway.stream_closed()


@dataclasses.dataclass(frozen=True)
class _Call:
    """A checked request and what answers it."""

    req: OpenAIRequest
    builder: ResponseBuilder
    echo: Echo | None
    splitter: ReasoningSplitter | None  # chat with a reasoning parser
    engine_id: str  # the engine's request id: the answer's id, unique where a client named it
    embeds: tuple[PromptEmbeds, ...] = ()  # completions' prompt_embeds, decoded


async def _prepare(gateway: Gateway, kind: Kind, raw: bytes, header_id: str | None = None) -> _Call:
    """Parse and check the body (ApiError naming the field), resolve its model. The answer's
    id is the client's (`header_id`, X-Request-Id, else the body's request_id), as vLLM's."""
    engine = gateway.engine
    # Chat answers run to the end of the context unless capped (the engine clips at
    # max_model_len; the model's generation_config may cap them, as vLLM's max_new_tokens);
    # completions keep OpenAI's default of 16.
    defaults = engine.sampling_defaults
    default_max_tokens = defaults.max_tokens_within(engine.max_model_len) if kind == "chat" else 16
    tool_parser = None  # only chat reads tools (the template is the chat's)
    if kind == "chat":
        tool_parser = gateway.settings.auto_tool_parser(engine.tokenizer.chat_template)
    req = parse_request(
        kind, raw, default_max_tokens=default_max_tokens, tool_parser=tool_parser, defaults=defaults
    )
    if req.stream and gateway.settings.enable_force_include_usage:
        req = dataclasses.replace(req, include_usage=True)
    served = gateway.served_models()
    req = req.with_lora(served.lora_for(req.model))
    num_prompts = len(req.prompts) + len(req.prompt_embeds)
    if num_prompts > (limit := gateway.settings.max_prompts_per_request):
        raise invalid("prompt", f"at most {limit} prompts per request, got {num_prompts}")
    embeds = decoded_embeds(req.prompt_embeds, max_bytes=gateway.settings.max_body_bytes)
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    request_id = engine_id = f"{prefix}-{uuid.uuid4().hex}"
    if (named := header_id or req.request_id) is not None:
        field = "X-Request-Id" if header_id else "request_id"
        if not 0 < len(named) <= MAX_REQUEST_ID:
            raise invalid(field, f"{field} must be 1 to {MAX_REQUEST_ID} characters")
        request_id = f"{prefix}-{named}"  # two in flight may share it: the engine's differ
        engine_id = f"{request_id}-{uuid.uuid4().hex[:12]}"
    if req.user is not None:
        log.debug("request from a named user", request_id=request_id, user=req.user)
    builder = ResponseBuilder(
        kind,
        served.name_of(req.params.lora),
        request_id,
        engine.tokenizer,
        continuous_usage=req.continuous_usage,
        tokens_as_ids=_tokens_as_ids(req, gateway),
    )
    echo = None
    if isinstance(req.echo, str) and kind == "chat":
        echo = Echo.of_chat(req.echo, req.params.n)
    elif req.echo is not None:
        echo = await echo_for(
            engine.tokenizer,
            req.prompts,
            n=req.params.n,
            num_top=req.params.logprobs,
            is_prompt_only=req.is_echo_only,
        )
    splitter = None
    if kind == "chat":
        parser = gateway.settings.reasoning_parser
        messages = cast(list[ChatMessage] | ChatPrompt, req.prompt)  # a chat request's prompt
        messages = await fetch_prompt_images(messages, gateway.settings)  # http(s) images
        splitter, params, prompt = chat_reasoning(
            parser, engine.tokenizer, messages, req.params, req.tools
        )
        req = dataclasses.replace(req, params=params, prompt=prompt)
    else:  # a completion has no splitter, but its thinking may have a budget
        params = with_thinking_tags(gateway.settings.reasoning_parser, req.params)
        req = dataclasses.replace(req, params=params)
    return _Call(req, builder, echo, splitter, engine_id, embeds)


def _tokens_as_ids(req: OpenAIRequest, gateway: Gateway) -> bool:
    """vLLM's return_tokens_as_token_ids: the request's, else the server's flag."""
    if req.tokens_as_ids is not None:
        return req.tokens_as_ids
    return gateway.settings.return_tokens_as_token_ids


def _events(engine: EngineLike, call: _Call, request_id: str) -> Any:
    req = call.req
    if call.embeds:  # each a prompt, before the text ones (vLLM's order)
        names = prompt_names(len(call.embeds), len(req.prompts))
        prompts = [*call.embeds, *req.prompts]
        return batch_events(engine, prompts, req.params, request_id, names=names)
    if req.prompts:  # completions: one prompt or a batch of them
        return batch_events(engine, req.prompts, req.params, request_id)
    return engine.generate(req.prompt, req.params, request_id=request_id)


async def _answer(gateway: Gateway, call: _Call) -> dict[str, Any]:
    """Run a non-streaming request to its whole body."""
    req, builder, engine = call.req, call.builder, gateway.engine
    gateway.stream_opened()
    try:
        if req.beam is not None:  # vLLM's use_beam_search: answered when the beams are known
            return beam_body(builder, *await beam_result(engine, req, call.echo))
        events = _events(engine, call, call.engine_id)
        return await _whole(events, builder, req, call.echo, call.splitter)
    finally:
        gateway.stream_closed()


async def _whole(
    events: Any,
    builder: ResponseBuilder,
    req: OpenAIRequest,
    echo: Echo | None,
    splitter: ReasoningSplitter | None,
) -> dict[str, Any]:
    """Collect the stream (one choice per sample, by index; each opens with its prompt's
    `echo`; `splitter`: the reasoning parser's, its thinking into `reasoning_content`); a
    vanished client cancels this handler, which aborts the request."""
    n = req.params.n
    texts: dict[int, list[str]] = defaultdict(list)
    if echo is not None:
        for index in range(len(echo.texts) * n):
            texts[index].append(echo.text(index))
    logprobs: dict[int, list[TokenLogprob]] = {}
    prompts = PromptLogprobsSeen(
        req.kind, req.params.prompt_logprobs, echo, builder.prompt_token_text
    )
    choices: dict[int, dict[str, Any]] = {}
    usages: list[tuple[int, Usage]] = []
    reasoning: dict[int, list[str]] = defaultdict(list)
    ids = TokenIds(req.kind) if req.return_token_ids else None
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, Rejected | Aborted | Failed):
                raise error_for_event(event, req.client_fields)  # one sample's failure fails all
            index = event.index
            if splitter is not None:
                thought, event = splitter.split(event)
                reasoning[index].append(thought)
            prompts.see(event)
            if ids is not None:
                ids.see(event)
            if echo is None or not echo.is_prompt_only:  # else the prompt alone is shown
                texts[index].append(event.text)
                if event.logprobs is not None:
                    logprobs.setdefault(index, []).extend(event.logprobs)
            if isinstance(event, Finished):
                text, finish = "".join(texts[index]), str(event.finish_reason)
                calls, content = None, None
                if req.tools is not None and finish == "stop":
                    if req.tools.spec is None:  # "auto": the model's own format
                        content, found = parse_auto_calls(text, req.tools.tools, req.tools.parser)
                        calls = found or None
                    else:
                        calls = tool_calls(req.tools, text)
                lps = logprobs.get(index)
                choices[index] = builder.choice(
                    index, text, finish, lps, event.stop_reason, calls, content, prompts.lead(index)
                )
                prompts.add_to_choice(choices[index], index)
                if ids is not None:
                    ids.add_to_choice(choices[index], index)
                if splitter is not None:  # vLLM's: no content after all thinking is null
                    message = choices[index]["message"]
                    said = "".join(reasoning[index]) or None
                    message["reasoning_content"] = said if req.include_reasoning else None
                    if said is not None and not message["content"]:
                        message["content"] = None
                usages.append((index, event.usage))
            if event.is_terminal:
                ordered = [choices[i] for i in sorted(choices)]
                body = prompts.add_to_response(
                    builder.full_choices(ordered, batch_usage(usages, n))
                )
                return body if ids is None else ids.add_to_response(body)
    raise ApiError(500, "the engine ended the stream without a terminal event")


async def _stream(
    request: web.Request,
    gateway: Gateway,
    events: Any,
    builder: ResponseBuilder,
    req: OpenAIRequest,
    echo: Echo | None,
    splitter: ReasoningSplitter | None,
) -> web.StreamResponse:
    first = await first_event(events, req.client_fields)

    async def fill(outbox: Outbox, on_overflow: Callable[[], None]) -> None:
        builder.see_prompt(first)  # continuous usage: the chunks before the first event's
        if req.kind == "chat":
            for index in range(req.params.n):
                chunk = builder.role_chunk(index)
                if req.return_token_ids and index == 0 and isinstance(first, Delta | Finished):
                    chunk["prompt_token_ids"] = first.prompt_token_ids  # vLLM's: on the first
                outbox.put(_sse(chunk))
        if echo is not None and not echo.has_logprobs:  # with logprobs: each choice's first event
            for index in range(len(echo.texts) * req.params.n):
                if text := echo.text(index):
                    outbox.put(_sse(builder.delta_chunk(text, None, index=index)))
        await _pump_sse(events, outbox, builder, req, echo, splitter, first, on_overflow)

    return await serve_sse(request, gateway.settings, fill, builder.id)


async def _pump_sse(
    events: Any,
    outbox: Outbox,
    builder: ResponseBuilder,
    req: OpenAIRequest,
    echo: Echo | None,
    splitter: ReasoningSplitter | None,
    first: StreamEvent,
    on_overflow: Callable[[], None],
) -> None:
    calls = call_stream(req.tools)
    usages: list[tuple[int, Usage]] = []  # each sample's (choice, usage), for the last chunk
    text_frames = None if req.return_token_ids else text_delta_frames(builder)
    echoed: set[int] = set()  # echo with logprobs: the choices whose prompt chunk went out

    def with_ids(chunk: dict[str, Any], event: Delta | Finished) -> str:
        """A choice's chunk as SSE, with its token ids when the request asked for them."""
        return _sse(chunk_with_ids(chunk, event, req.kind) if req.return_token_ids else chunk)

    def encode(event: StreamEvent) -> Iterable[str]:
        builder.count(event)
        if splitter is not None and isinstance(event, Delta | Finished):
            thought, event = splitter.split(event)  # the thinking first, then the content
            if thought and req.include_reasoning:
                yield _sse(builder.reasoning_chunk(thought, event.index))
        if echo is not None and isinstance(event, Delta | Finished):
            if echo.has_logprobs and event.index not in echoed:
                echoed.add(event.index)  # the prompt's text and rows, as vLLM's first chunk
                lead = echo.rows(event.index, event.prompt_logprobs, builder.prompt_token_text)
                yield _sse(
                    builder.delta_chunk(echo.text(event.index), None, index=event.index, lead=lead)
                )
            if echo.is_prompt_only:  # the token the engine ran is not shown
                event = msgspec.structs.replace(event, text="", logprobs=None)
        if calls is not None and isinstance(event, Delta | Finished):
            yield from tool_call_chunks(builder, calls, event)
            if isinstance(event, Finished):
                if req.include_usage:
                    yield _sse(builder.usage_chunk(event.usage))
                yield _DONE
            return
        if isinstance(event, Delta):
            if event.logprobs is None and text_frames is not None:
                if event.text:  # the common frame, from its template
                    yield text_frames.frame(event.text, event.index)
            elif event.text or event.logprobs or req.return_token_ids:
                yield with_ids(
                    builder.delta_chunk(event.text, event.logprobs, index=event.index), event
                )
        elif isinstance(event, Finished):
            finish, index = str(event.finish_reason), event.index
            chunk = builder.delta_chunk(
                event.text, event.logprobs, finish, event.stop_reason, index
            )
            yield with_ids(chunk, event)
            usages.append((index, event.usage))
            if not event.is_terminal:
                return  # more samples to come
            if req.include_usage:
                yield _sse(builder.usage_chunk(batch_usage(usages, req.params.n)))
            yield _DONE
        else:
            yield _sse(error_for_event(event, req.client_fields).body())
            if event.is_terminal:
                yield _DONE

    try:
        await pump_sse(events, outbox, encode, first, on_overflow)
    finally:
        outbox.close()
