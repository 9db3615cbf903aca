"""SGLang's POST /encode: an embedding model's vectors in SGLang's native shape, run as
/v1/embeddings runs them (gateway/embeddings_bodies.py, gateway/pooled_vectors.py).

    {"text": str | [str, ...]} or {"input_ids": [int, ...] | [[int, ...], ...]},
    "rid"?, "lora_path"? (an adapter by name, as /generate takes it), "normalize"? (troupe's,
    default true)
    -> one input:  {"embedding": [float, ...], "meta_info": {"id", "prompt_tokens",
                    "completion_tokens": 0, "cached_tokens": 0, "e2e_latency"}}
    -> a list:     a list of those, in order

Errors are the embeddings route's, naming the field the client wrote (`text[1]`, not
`input[1]`). Behind the API key like /v1/*.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from aiohttp import web
from troupe.gateway.embeddings_bodies import parse_embedding_request
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.openai_bodies import decode_body
from troupe.gateway.pooled_vectors import input_vectors
from troupe.gateway.state import GATEWAY

PATH = "/encode"
_json = msgspec.json.Encoder()


class EncodeBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    text: str | list[str] | None = None
    input_ids: list[int | list[int]] | None = None  # ids, or lists of them (checked as input)
    rid: str | list[str] | None = None
    lora_path: str | None = None
    normalize: bool | None = None


def add_encode_route(app: web.Application) -> None:
    app.router.add_post(PATH, encode)


async def encode(request: web.Request) -> web.Response:
    start = time.monotonic()
    gateway = request.app[GATEWAY]
    body = decode_body(await read_json_body(request, gateway.settings), EncodeBody)
    if (body.text is None) == (body.input_ids is None):
        raise invalid("text", "send exactly one of 'text' and 'input_ids'")
    source = "text" if body.text is not None else "input_ids"
    given: Any = body.text if body.text is not None else body.input_ids
    is_list = isinstance(given, list) and any(not isinstance(one, int) for one in given)
    rids = _rids(body.rid, len(given) if is_list else 1)
    openai: dict[str, Any] = {"input": given, "model": body.lora_path}
    if body.normalize is not None:
        openai["normalize"] = body.normalize
    settings = gateway.settings
    try:
        req = parse_embedding_request(
            _json.encode(openai),
            served_model=gateway.served_models().model_id,
            pooling_type=settings.pooling_type,
            max_inputs=settings.max_embedding_inputs,
        )
        answer = await input_vectors(gateway, req, "encode")
    except ApiError as exc:
        raise _renamed(exc, source) from None
    latency = time.monotonic() - start
    rows = [
        {
            "embedding": list(vector),
            "meta_info": {
                "id": rid,
                "prompt_tokens": tokens,
                "completion_tokens": 0,
                "cached_tokens": 0,
                "e2e_latency": latency,
            },
        }
        for vector, tokens, rid in zip(answer.vectors, answer.prompt_tokens, rids, strict=True)
    ]
    out: Any = rows if is_list else rows[0]
    return web.json_response(out, dumps=lambda o: _json.encode(o).decode())


def _rids(rid: str | list[str] | None, count: int) -> list[str]:
    """One id an input: as sent (a list: one each), else fresh ones."""
    if rid is None:
        return [uuid.uuid4().hex for _ in range(count)]
    if isinstance(rid, str):
        return [rid] if count == 1 else [f"{rid}-{i}" for i in range(count)]
    if len(rid) != count:
        raise invalid("rid", f"rid lists {len(rid)} ids for {count} texts or id lists")
    return rid


def _renamed(error: ApiError, source: str) -> ApiError:
    """The embeddings route's error, with `input` spelled as the client's field."""
    param = error.param
    if param is not None and param.startswith("input"):
        param = source + param.removeprefix("input")
    message = error.message.replace("'input", f"'{source}").replace("input[", f"{source}[")
    return ApiError(error.status, message, param=param, code=error.code, headers=error.headers)
