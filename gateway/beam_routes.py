"""`use_beam_search` on /v1/completions and /v1/chat/completions: vLLM's beam search, answered
when the beams are known (gateway/beam_requests.py makes the request's BeamSearchParams).

    prompt ─► token ids ─────────► beam_search (actors/beam_search.py) ─► n beams, best first
              the gateway's         each round one 1-token request per        = choices 0..n-1
              tokenizer, off the    live beam asking for 2n logprobs
              loop; chat rendered
              as the engine does

- A list of prompts (completions) runs one search per prompt, all at once; choices are
  numbered in order, prompt-major, as vLLM numbers them.
- Usage, as vLLM's: each prompt once, plus the returned beams' tokens; a beam ended by EOS
  holds it (and counts it) only with include_stop_str_in_output. A "stop" beam's stop_reason
  is its EOS id; the text never shows it.
- Chat with stream: the answer at the end, as chunks (each choice's role, then its whole text
  with its finish_reason, the usage if asked, [DONE]), as vLLM's chat streams its one beam
  search output. Completions refuse stream (as vLLM does).
- A round refused by the engine fails the whole request with the engine's status and field;
  the other searches' requests are aborted. Each round's requests are engine requests like
  any other (metrics count them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
import structlog
from aiohttp import web
from anyio.abc import TaskGroup
from troupe.actors.beam_search import Beam, BeamSearchError, BeamSearchParams, beam_search
from troupe.gateway.engine_api import EngineLike, TokenizerLike
from troupe.gateway.errors import ApiError, error_for_event, invalid
from troupe.gateway.openai_requests import OpenAIRequest
from troupe.gateway.openai_responses import ResponseBuilder
from troupe.gateway.prompt_logprobs import Echo
from troupe.gateway.sse_frames import DONE, sse
from troupe.gateway.tokenize_routes import render_chat
from troupe.messages import ChatPrompt, Usage

log = structlog.get_logger("troupe.gateway")

_json = msgspec.json.Encoder()

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


async def beam_answer(
    request: web.Request,
    engine: EngineLike,
    req: OpenAIRequest,
    builder: ResponseBuilder,
    echo: Echo | None,
) -> web.StreamResponse:
    """Run the request's beam search and answer it (JSON, or chat's SSE at the end)."""
    answers, usage = await beam_result(engine, req, echo)
    if not req.stream:
        body = beam_body(builder, answers, usage)
        return web.json_response(body, dumps=lambda o: _json.encode(o).decode())
    frames = [sse(builder.role_chunk(a.index)) for a in answers]
    frames += [
        sse(builder.delta_chunk(a.text, None, a.finish, a.stop_reason, a.index)) for a in answers
    ]
    if req.include_usage:
        frames.append(sse(builder.usage_chunk(usage)))
    frames.append(DONE)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    try:
        await response.write("".join(frames).encode())
        await response.write_eof()
    except ConnectionError:
        log.debug("client went away before the beams were sent", request_id=builder.id)
    return response


async def beam_result(
    engine: EngineLike, req: OpenAIRequest, echo: Echo | None
) -> tuple[list[BeamAnswer], Usage]:
    """Run the request's beam search: its choices, in order, and the usage."""
    assert req.beam is not None
    prompts: Sequence[Any] = req.prompts or (req.prompt,)
    fields = [_field(req, i) for i in range(len(prompts))]
    prompt_ids = [
        await prompt_token_ids(engine.tokenizer, prompt, field, req.params.add_special_tokens)
        for prompt, field in zip(prompts, fields, strict=True)
    ]
    beams = await _search(engine, prompt_ids, req.beam, req, fields)
    include_stop = req.params.include_stop_str_in_output
    answers = beam_answers(beams, echo, include_stop=include_stop)
    usage = Usage(
        prompt_tokens=sum(map(len, prompt_ids)),
        completion_tokens=sum(a.num_tokens for a in answers),
    )
    return answers, usage


def beam_body(builder: ResponseBuilder, answers: list[BeamAnswer], usage: Usage) -> dict[str, Any]:
    """The whole JSON answer of a beam search."""
    choices = [builder.choice(a.index, a.text, a.finish, None, a.stop_reason) for a in answers]
    return builder.full_choices(choices, usage)


class BeamAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """One choice of a beam search's answer."""

    index: int
    text: str  # echo: the prompt's text first
    finish: str  # "stop" (EOS) or "length"
    stop_reason: int | None  # the EOS id that ended the beam (vLLM's)
    num_tokens: int  # what usage counts


def beam_answers(
    beams: Sequence[Sequence[Beam]], echo: Echo | None, *, include_stop: bool
) -> list[BeamAnswer]:
    """Each prompt's beams (best first) as choices, numbered in order, prompt-major."""
    answers: list[BeamAnswer] = []
    for i, prompt_beams in enumerate(beams):
        lead = echo.texts[i] if echo is not None else ""
        for beam in prompt_beams:
            is_eos = beam.finish_reason == "stop"
            answers.append(
                BeamAnswer(
                    index=len(answers),
                    text=lead + beam.text,
                    finish=beam.finish_reason,
                    stop_reason=beam.token_ids[-1] if is_eos else None,
                    num_tokens=len(beam.token_ids) - (is_eos and not include_stop),
                )
            )
    return answers


async def prompt_token_ids(
    tokenizer: TokenizerLike, prompt: Any, field: str, add_special_tokens: bool | None
) -> list[int]:
    """A prompt's token ids as the engine's tokenizer actor makes them (off the event loop:
    prompts and templates run long): text with special tokens, chat messages rendered and
    encoded without (`add_special_tokens` overrides both); token ids as sent (the engine
    checks them in the first round)."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return prompt
    if isinstance(prompt, str):
        text, special = prompt, True
    else:
        chat = prompt
        if not isinstance(chat, ChatPrompt):  # the messages, with the template's defaults
            chat = ChatPrompt(messages=tuple(prompt))
        for i, turn in enumerate(chat.messages):  # its rounds run on token ids alone
            for j, part in enumerate(turn.parts or ()):
                if part.type == "image":
                    at = f"messages[{i}].content[{j}]"
                    raise invalid(at, f"{at}: beam search takes no images")
        text, special = await asyncio.to_thread(render_chat, tokenizer, chat), False
    if add_special_tokens is not None:
        special = add_special_tokens
    try:
        text.encode("utf-8")  # the Rust tokenizer fails on a lone surrogate: name the field
    except UnicodeEncodeError as exc:
        message = f"{field} is not valid Unicode text: lone surrogate at character {exc.start}"
        raise invalid(field, message) from None
    return list(await asyncio.to_thread(tokenizer.encode, text, special))


async def _search(
    engine: EngineLike,
    prompt_ids: list[list[int]],
    params: BeamSearchParams,
    req: OpenAIRequest,
    fields: list[str],
) -> list[list[Beam]]:
    """One search per prompt, all at once; the first refusal cancels the others."""
    results: list[list[Beam]] = [[] for _ in prompt_ids]
    errors: list[tuple[int, BeamSearchError]] = []

    async def one(i: int, tg: TaskGroup) -> None:
        try:
            results[i] = await beam_search(engine, prompt_ids[i], params)
        except BeamSearchError as exc:  # not raised here: the group would wrap it
            errors.append((i, exc))
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        for i in range(len(prompt_ids)):
            tg.start_soon(one, i, tg)
    if not errors:
        return results
    i, exc = errors[0]
    if exc.event is None:
        raise ApiError(500, f"beam search failed: {exc}", code="internal_error")
    error = error_for_event(exc.event, req.client_fields)
    if error.param == "prompt" and len(fields) > 1:  # prompt i of a list, as prompt_batch's
        error.param = fields[i]
    raise error


def _field(req: OpenAIRequest, i: int) -> str:
    """The field prompt i came in: `messages`, `prompt`, or `prompt[i]` in a list of them."""
    if req.kind == "chat":
        return "messages"
    return f"prompt[{i}]" if len(req.prompts) > 1 else "prompt"
