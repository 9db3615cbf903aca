"""Proxy one OpenAI request to the replica the policy picks; SSE streams pass through as they come.

    client ──POST──► router: key = routing_key(body) ─► ReplicaSet.route ─► replica i
                        │ refused / unreachable before any answer: replica i marked down; a 503:
                        │ its /health decides; the next replica is tried (each at most once)
                        ▼
                     answer: JSON as the replica sent it, or its SSE stream chunk by chunk

Every request ends with exactly one terminal event: when the replica's stream breaks, or ends
without its endpoint's end (`data: [DONE]`; a Responses stream's `response.completed` or
`error`: gateway/router_streams.py), the client gets that endpoint's error event and the
replica is marked down; a JSON answer cut short is a 502; no replica up is a 503 naming how
many are configured and which are down. A client that goes away closes the replica's
connection, which aborts the request there.

A stored response lives on the replica that made it (its id names that replica's home:
gateway/responses_store.py). A request that must meet it, a create with
`previous_response_id` (the endpoint's `stored`) or a read of it (gateway/router_stored.py),
goes to that replica whatever the policy would say, and only there: when it is down or fails
before answering, the answer is a 503 naming it. An id no replica's home is in goes the
policy's way (a create) and the replica answers that it holds no such response.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from troupe.gateway.errors import ApiError
from troupe.gateway.router_keys import KeyText, routing_key
from troupe.gateway.router_replicas import NoReplicaUp, Replica, ReplicaSet
from troupe.gateway.router_streams import DONE_SENTINEL, LastEvent, StreamFormat

_FORWARDED = ("Authorization", "X-Api-Key", "Content-Type", "Accept")  # x-api-key: Anthropic's
_REPLICA_HEADER = "X-Troupe-Replica"  # which replica answered (its index), for debugging
# What a replica's failure can raise while we read from it.
_READ_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)

ROUTER = web.AppKey("router", ReplicaSet)
SESSION = web.AppKey("router_session", aiohttp.ClientSession)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The stored response a request body continues (previous_response_id), if any
StoredRef = Callable[[dict[str, Any]], str | None]


@dataclass(frozen=True)
class Endpoint:
    """A proxied endpoint: what its routing key reads, and how its streams end."""

    text: KeyText
    stream: StreamFormat = DONE_SENTINEL
    stored: StoredRef | None = None


class _TryAnother(Exception):
    """The replica failed before answering; the request can go to another one."""


def proxy_to(endpoint: Endpoint) -> Handler:
    """The handler that proxies `endpoint`'s POSTs."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await proxy(request, endpoint)

    return handler


async def proxy(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    """POST a request to a replica (the next one if it fails before answering); its answer."""
    replicas = request.app[ROUTER]
    body = await request.read()
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past the interpreter's limit
        parsed = None  # the replica answers the 400
    if endpoint.stored is not None and isinstance(parsed, dict):
        response_id = endpoint.stored(parsed)
        holder = replicas.holder_of(response_id) if response_id is not None else None
        if response_id is not None and holder is not None:
            return await proxy_to_holder(request, response_id, holder, body, endpoint.stream)
    key = routing_key(parsed, endpoint.text)
    headers = {k: v for k in _FORWARDED if (v := request.headers.get(k)) is not None}
    tried: set[int] = set()
    while True:
        try:
            replica = replicas.route(key, exclude=tried)
        except NoReplicaUp as exc:
            error = ApiError(503, str(exc), code="no_replica_up", headers={"Retry-After": "1"})
            raise error from None
        tried.add(replica.index)
        try:
            return await _forward(request, replica, body, headers, endpoint.stream)
        except _TryAnother:
            continue
        finally:
            replicas.release(replica)


async def proxy_to_holder(
    request: web.Request, response_id: str, holder: Replica, body: bytes, stream: StreamFormat
) -> web.StreamResponse:
    """Send a request to the replica holding stored response `response_id`, and only there."""
    replicas = request.app[ROUTER]
    if holder.is_up:
        headers = {k: v for k in _FORWARDED if (v := request.headers.get(k)) is not None}
        replicas.take(holder)
        try:
            return await _forward(request, holder, body, headers, stream)
        except _TryAnother:
            pass
        finally:
            replicas.release(holder)
    message = (
        f"the replica that stores response {response_id!r:.100} ({holder.url}) is down or "
        "refused the request, and the response is only there"
    )
    raise ApiError(503, message, code="replica_unavailable", headers={"Retry-After": "1"})


async def _forward(
    request: web.Request,
    replica: Replica,
    body: bytes,
    headers: dict[str, str],
    stream: StreamFormat,
) -> web.StreamResponse:
    replicas, session = request.app[ROUTER], request.app[SESSION]
    url = f"{replica.url}{request.rel_url}"  # the path and its query
    async with contextlib.AsyncExitStack() as stack:
        try:
            answer = session.request(request.method, url, data=body, headers=headers)
            resp = await stack.enter_async_context(answer)
        except _READ_ERRORS as exc:
            replicas.fail(replica, f"request failed: {exc!r}")
            raise _TryAnother from exc
        if resp.status == 503:  # draining, failed, or at its connection cap: /health decides
            replicas.fail(replica, "answered 503", is_down=False)
            await replicas.check(session, replica)
            raise _TryAnother
        if resp.content_type == "text/event-stream":
            return await _pipe_stream(request, resp, replica, stream)
        try:
            data = await resp.read()
        except _READ_ERRORS as exc:
            replicas.fail(replica, f"answer cut: {exc!r}")
            message = f"replica {replica.url} failed while answering: {exc!r}"
            raise ApiError(502, message, code="replica_failed") from exc
        out_headers = {_REPLICA_HEADER: str(replica.index)}
        if (retry := resp.headers.get("Retry-After")) is not None:
            out_headers["Retry-After"] = retry
        return web.Response(
            status=resp.status, body=data, content_type=resp.content_type, headers=out_headers
        )
    raise AssertionError("unreachable")  # mypy: the exit stack does not swallow exceptions


async def _pipe_stream(
    request: web.Request, resp: aiohttp.ClientResponse, replica: Replica, stream: StreamFormat
) -> web.StreamResponse:
    """Write the replica's SSE bytes as they arrive; end with an error event if it breaks."""
    out = web.StreamResponse(
        status=resp.status,
        headers={
            "Content-Type": resp.headers.get("Content-Type", "text/event-stream"),
            "Cache-Control": "no-cache",
            _REPLICA_HEADER: str(replica.index),
        },
    )
    await out.prepare(request)
    last, broken = LastEvent(), ""
    chunks = resp.content.iter_any().__aiter__()
    while True:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            break
        except _READ_ERRORS as exc:
            broken = f"replica {replica.url} failed mid-stream: {exc!r}"
            break
        await out.write(chunk)  # a client gone raises here: the replica's connection closes
        last.feed(chunk)
    # A stream that reached its end is whole, whatever the connection did after it.
    if not (last.is_complete and stream.is_end(last.event)):
        error = broken or f"replica {replica.url} closed the stream before its end"
        request.app[ROUTER].fail(replica, error)
        await out.write(
            stream.error_frames(ApiError(502, error, code="replica_failed"), last.event)
        )
    await out.write_eof()
    return out
