"""POST /tokenize and /detokenize, in vLLM's request and response shapes.

    /tokenize    {"prompt": str, "add_special_tokens": true}
                 {"messages": [...], "add_generation_prompt": true, "add_special_tokens": false,
                  "continue_final_message": false, "chat_template_kwargs": {...}, "tools": [...]}
                 (either with "return_token_strs": false)
                 -> {"count", "max_model_len", "tokens", "token_strs": each token's vocabulary
                     entry with return_token_strs, else null}
    /detokenize  {"tokens": [int, ...]} -> {"prompt": str}

Also served as /v1/tokenize and /v1/detokenize (SGLang's paths). The gateway's own read-only
tokenizer answers (the engine's graph is not involved); chat messages (and tools) are rendered
with the model's template, as the tokenizer actor renders them. Behind the API key like /v1/*.
Bad input is a 400 naming its field.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from aiohttp import web
from troupe.actors.core.chat_messages import ChatMessageError, template_messages
from troupe.actors.core.chat_template import ChatTemplateError
from troupe.actors.request_input import RequestInputError, check_chat_options
from troupe.gateway.chat_messages import chat_messages
from troupe.gateway.engine_api import TokenizerLike
from troupe.gateway.errors import invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.openai_bodies import Message, decode_body
from troupe.gateway.state import GATEWAY
from troupe.gateway.tool_calls import Tool, as_sent
from troupe.messages import ChatPrompt

PATHS = ("/tokenize", "/detokenize")


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None


class TokenizeBody(_Body, kw_only=True):
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True  # messages only, as the two below
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False  # vLLM's: each token's vocabulary entry ("Ġworld")
    tools: list[Tool] | None = None  # messages only: the template renders them, as chat's


class DetokenizeBody(_Body, kw_only=True):
    tokens: list[int]


async def tokenize(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    engine = gateway.engine
    body = decode_body(await read_json_body(request, gateway.settings), TokenizeBody)
    gateway.served_models().lora_for(body.model)  # an adapter's name is fine: one tokenizer
    if (body.prompt is None) == (body.messages is None):
        raise invalid("prompt", "send exactly one of 'prompt' and 'messages'")
    tokenizer = engine.tokenizer
    if body.messages is not None:
        kwargs = {"tools": [as_sent(t) for t in body.tools]} if body.tools else {}
        chat = ChatPrompt(
            messages=tuple(chat_messages(body.messages)),
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            template_kwargs={**kwargs, **(body.chat_template_kwargs or {})} or None,
        )
        text = render_chat(tokenizer, chat)
        special = bool(body.add_special_tokens)
    else:
        chat_only = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                     "tools")  # fmt: skip
        for name, default in zip(chat_only, (True, False, None, None), strict=True):
            if getattr(body, name) != default:
                raise invalid(name, f"{name} needs 'messages'")
        text, special = str(body.prompt), body.add_special_tokens is not False
    # a long prompt is encoded off the event loop (the body size bounds it)
    ids = list(await asyncio.to_thread(tokenizer.encode, text, special))
    return web.json_response(
        {
            "count": len(ids),
            "max_model_len": engine.max_model_len,
            "tokens": ids,
            "token_strs": tokenizer.token_strs(ids) if body.return_token_strs else None,
        }
    )


def render_chat(tokenizer: TokenizerLike, chat: ChatPrompt) -> str:
    """The text the tokenizer actor renders for `chat` (encode it without special tokens, as
    the actor does), or a 400 naming the field; /tokenize's and beam search's."""
    try:
        check_chat_options(chat)  # as a chat request's (the engine's edge)
        return tokenizer.render_chat(
            template_messages(chat.messages),
            add_generation_prompt=chat.add_generation_prompt,
            continue_final_message=chat.continue_final_message,
            **(chat.template_kwargs or {}),
        )
    except (RequestInputError, ChatMessageError) as exc:
        raise invalid(exc.field, str(exc)) from None
    except ChatTemplateError as exc:
        raise invalid("messages", str(exc)) from None


async def detokenize(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    engine = gateway.engine
    body = decode_body(await read_json_body(request, gateway.settings), DetokenizeBody)
    gateway.served_models().lora_for(body.model)  # an adapter's name is fine: one tokenizer
    tokenizer = engine.tokenizer
    limit = tokenizer.vocab_size
    for i, token_id in enumerate(body.tokens):
        if not 0 <= token_id < limit:
            raise invalid(f"tokens[{i}]", f"token id {token_id} is outside [0, {limit})")
    text = await asyncio.to_thread(tokenizer.decode, body.tokens, False)
    return web.json_response({"prompt": text})


def add_tokenize_routes(app: web.Application) -> None:
    for prefix in ("", "/v1"):  # vLLM's paths, and SGLang's under /v1 too
        app.router.add_post(f"{prefix}/tokenize", tokenize)
        app.router.add_post(f"{prefix}/detokenize", detokenize)
