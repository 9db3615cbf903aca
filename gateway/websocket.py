"""GET /v1/ws: many requests multiplexed on one socket, JSON text frames both ways.

Client: {"type": "generate", "request_id", "prompt" | "messages", "model"?, ...sampling fields}
and {"type": "cancel", "request_id"}; `model` names the base model or a LoRA adapter, as on HTTP.
Server: {"type": "delta", ...} frames, then exactly one {"type": "done", ...} or
{"type": "error", ...} per request. A malformed frame gets an error frame and the socket goes
on; a closed socket aborts all of its requests.

One pump task per request moves engine events into the socket's bounded Outbox; one writer
task drains it. A reader too far behind is sent an error and the socket is closed (1008).

A cancel wins whenever it arrives before the request's terminal event:
- before the pump has started, the request never reaches the engine (`done`, "abort");
- once started, the engine is asked to abort at once, and again at the first event, which
  proves the request is in the engine (an abort sent earlier may have raced its request);
  the engine's own Aborted event, with full usage, ends the stream.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Iterable
from typing import Any, cast

import structlog
from aiohttp import WSCloseCode, WSMsgType, web
from troupe.gateway.errors import ApiError
from troupe.gateway.image_fetch import fetch_prompt_images
from troupe.gateway.outbox import Outbox, Overflow
from troupe.gateway.pump import abort_transport_later, pump
from troupe.gateway.state import GATEWAY, Gateway
from troupe.gateway.ws_auth import WS_PROTOCOL
from troupe.gateway.ws_frames import cancelled_frame, encode_event, error_frame
from troupe.gateway.ws_requests import Cancel, FrameError, Generate, parse_frame
from troupe.messages import ChatMessage, ChatPrompt, StreamEvent

log = structlog.get_logger("troupe.gateway")

_CLOSE_GRACE_SECONDS = 5.0  # for the writer to flush the last frames of a closing socket


async def websocket(request: web.Request) -> web.WebSocketResponse:
    gateway = request.app[GATEWAY]
    ws = web.WebSocketResponse(
        heartbeat=gateway.settings.ws_heartbeat,
        max_msg_size=gateway.settings.max_body_bytes,
        protocols=(WS_PROTOCOL,),  # selected when offered (the page offers its key beside it)
    )
    await ws.prepare(request)
    gateway.websockets.add(ws)
    try:
        await WsSession(request, ws, gateway).run()
    except Exception:
        # A bug: never let it reach the error middleware, which would write an HTTP response
        # into the upgraded socket. Close it as a websocket, keep the traceback in the log.
        log.exception("websocket session failed")
        if not ws.closed:
            await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"internal error")
    return ws


class WsRequest:
    """One client request on the socket: ids, its pump task and where its cancel stands."""

    def __init__(self, client_id: str, engine_id: str) -> None:
        self.client_id = client_id
        self.engine_id = engine_id
        self.task: asyncio.Task[None] | None = None
        self.is_started = False  # the pump has handed the request to the engine
        self.is_cancelled = False
        self.num_events = 0


class WsSession:
    """One socket: its reader loop, writer task and per-request pumps."""

    def __init__(self, request: web.Request, ws: web.WebSocketResponse, gateway: Gateway) -> None:
        self.request = request
        self.ws = ws
        self.gateway = gateway
        settings = gateway.settings
        self.outbox = Outbox(
            max_frames=settings.max_buffered_frames, max_bytes=settings.max_buffered_bytes
        )
        self.requests: dict[str, WsRequest] = {}  # by client request id, while in flight
        self._tasks: set[asyncio.Task[None]] = set()  # pumps and aborts, until they end
        self.session_id = uuid.uuid4().hex[:12]
        self.num_started = 0
        self._abort_timer: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        writer = asyncio.create_task(self._write())
        try:
            async for msg in self.ws:
                if msg.type == WSMsgType.TEXT:
                    self._on_text(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    self.outbox_put(error_frame(None, "invalid_request", "send JSON text frames"))
                if self.outbox.overflowed is not None:
                    break
        finally:
            # Shielded: aiohttp cancels this handler when the peer vanishes, and the pumps
            # (each aborts its request on the way out) and the writer must still end here
            # rather than be left pending.
            await asyncio.shield(self._close(writer))

    async def _close(self, writer: asyncio.Task[None]) -> None:
        for req in self.requests.values():
            if req.task is not None:
                req.task.cancel()  # the socket is gone: closing each stream aborts its request
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.outbox.close()
        done, _ = await asyncio.wait({writer}, timeout=_CLOSE_GRACE_SECONDS)
        if not done:  # stuck on a peer that stopped reading
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        log.debug("websocket closed", session=self.session_id, requests=self.num_started)

    async def _write(self) -> None:
        try:
            while (frame := await self.outbox.get()) is not None:
                await self.ws.send_str(frame)
            if self.outbox.overflowed is not None:
                await self.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"client too slow")
        except (ConnectionError, RuntimeError):
            pass  # the peer vanished; the reader loop ends and aborts what is left
        finally:
            if self._abort_timer is not None:
                self._abort_timer.cancel()

    def outbox_put(self, frame: str) -> None:
        try:
            self.outbox.put(frame)
        except Overflow as exc:
            self._cut_off(exc)

    def _cut_off(self, exc: Overflow) -> None:
        """Abort every request, queue a last error frame, and drop the socket if the writer
        cannot deliver it within the grace period (it may be stuck on a stalled peer)."""
        for req in self.requests.values():
            if req.task is not None:
                req.task.cancel()
        self.outbox.put_final(error_frame(None, "slow_consumer", str(exc)))
        self.outbox.close()
        if self._abort_timer is None:
            grace = self.gateway.settings.slow_client_grace
            self._abort_timer = abort_transport_later(self.request, grace)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_text(self, data: str) -> None:
        match parse_frame(data, self.gateway.engine.sampling_defaults):
            case FrameError(request_id, message, field, code):
                self.outbox_put(error_frame(request_id, code, message, field))
            case Cancel(request_id):
                self._cancel(request_id)
            case Generate() as command:
                self._generate(command)

    def _cancel(self, client_id: str) -> None:
        # Cancelling a finished or unknown request is a harmless race: ignore it.
        req = self.requests.get(client_id)
        if req is None or req.is_cancelled:
            return
        req.is_cancelled = True
        if req.is_started:
            self._abort(req)

    def _abort(self, req: WsRequest) -> None:
        self._spawn(self.gateway.engine.abort(req.engine_id, "cancelled by client"))

    def _generate(self, command: Generate) -> None:
        client_id = command.request_id

        def reject(message: str, field: str | None, code: str = "invalid_request") -> None:
            self.outbox_put(error_frame(client_id, code, message, field))

        try:  # what is served is the engine's fact, read per frame (as each HTTP route does)
            command = command.on_model(self.gateway.served_models())
        except ApiError as exc:
            return reject(exc.message, exc.param, exc.code or "invalid_request")
        if client_id in self.requests:
            return reject(f"request_id {client_id!r} is already in flight", "request_id")
        if self.gateway.is_draining:
            return reject("the server is shutting down", None, "shutting_down")
        if len(self.requests) >= self.gateway.settings.ws_max_requests:
            limit = self.gateway.settings.ws_max_requests
            return reject(f"at most {limit} requests in flight per socket", None, "overloaded")
        # Unique per generate: a client may reuse its ids once a request has ended.
        self.num_started += 1
        engine_id = f"ws-{self.session_id}-{self.num_started}-{client_id}"
        req = WsRequest(client_id, engine_id)
        self.requests[client_id] = req  # before the task runs: a cancel may come next
        req.task = self._spawn(self._run_request(req, command))
        return None

    async def _run_request(self, req: WsRequest, command: Generate) -> None:
        def encode(event: StreamEvent) -> Iterable[str]:
            req.num_events += 1
            if req.num_events == 1 and req.is_cancelled and not event.is_terminal:
                self._abort(req)  # now surely behind the request in the engine's inbox
            return encode_event(req.client_id, event, command.client_fields)

        try:
            prompt = command.prompt
            chat = isinstance(prompt, ChatPrompt) or (
                isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], ChatMessage)
            )
            if chat:  # http(s) image URLs: their bytes, fetched (gateway/image_fetch.py)
                messages = cast(list[ChatMessage] | ChatPrompt, prompt)
                try:
                    prompt = await fetch_prompt_images(messages, self.gateway.settings)
                except ApiError as exc:
                    message = error_frame(req.client_id, "invalid_request", str(exc), exc.param)
                    self.outbox_put(message)
                    return
            if req.is_cancelled:  # cancelled before it started: the engine never sees it
                self.outbox_put(cancelled_frame(req.client_id))
                return
            events = self.gateway.engine.generate(prompt, command.params, request_id=req.engine_id)
            # No await between here and the pump's first step, which hands the request to
            # the engine: a cancel read from now on is sent behind it.
            req.is_started = True
            self.gateway.stream_opened()
            try:
                await pump(events, self.outbox, encode)
            finally:
                self.gateway.stream_closed()
        except Overflow as exc:
            self._cut_off(exc)
        except Exception:  # a bug: this request ends with an error frame, the socket goes on
            log.exception("websocket request failed", request_id=req.engine_id)
            self.outbox_put(error_frame(req.client_id, "internal_error", "internal error"))
        finally:
            self.requests.pop(req.client_id, None)
