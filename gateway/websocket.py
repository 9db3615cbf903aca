"""GET /v1/ws: many requests multiplexed on one socket, JSON text frames both ways.

Client: {"type": "generate", "request_id", "prompt" | "messages", ...sampling fields} and
{"type": "cancel", "request_id"}. Server: {"type": "delta", ...} frames, then exactly one
{"type": "done", ...} or {"type": "error", ...} per request. A malformed frame gets an error
frame and the socket goes on; a closed socket aborts all of its requests.

One pump task per request moves engine events into the socket's bounded Outbox; one writer
task drains it. A reader too far behind is sent an error and the socket is closed (1008).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterable
from typing import Any

import msgspec
from aiohttp import WSCloseCode, WSMsgType, web
from troupe.gateway.errors import ApiError
from troupe.gateway.openai_requests import chat_messages
from troupe.gateway.outbox import Outbox, Overflow
from troupe.gateway.pump import abort_transport_later, pump
from troupe.gateway.state import GATEWAY, Gateway
from troupe.gateway.ws_frames import encode_event, error_frame, to_json
from troupe.messages import StreamEvent

_MAX_REQUEST_ID = 128
_RESERVED = ("type", "request_id", "prompt", "messages")  # frame keys that are not params


async def websocket(request: web.Request) -> web.WebSocketResponse:
    gateway = request.app[GATEWAY]
    ws = web.WebSocketResponse(
        heartbeat=gateway.settings.ws_heartbeat, max_msg_size=gateway.settings.max_body_bytes
    )
    await ws.prepare(request)
    gateway.websockets.add(ws)
    await WsSession(request, ws, gateway).run()
    return ws


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
        self.pumps: dict[str, asyncio.Task[None]] = {}
        self.engine_ids: dict[str, str] = {}  # client request id -> engine request id
        self._aborts: set[asyncio.Task[None]] = set()
        self.cancelled: set[str] = set()
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
            for task in self.pumps.values():
                task.cancel()  # the socket is gone: closing each stream aborts its request
            await asyncio.gather(*self.pumps.values(), return_exceptions=True)
            self.outbox.close()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

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
        for task in self.pumps.values():
            task.cancel()
        self.outbox.put_final(error_frame(None, "slow_consumer", str(exc)))
        self.outbox.close()
        if self._abort_timer is None:
            grace = self.gateway.settings.slow_client_grace
            self._abort_timer = abort_transport_later(self.request, grace)

    def _on_text(self, data: str) -> None:
        try:
            msg = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            self.outbox_put(error_frame(None, "invalid_request", f"frame is not JSON: {exc}"))
            return
        if not isinstance(msg, dict):
            self.outbox_put(error_frame(None, "invalid_request", "a frame must be a JSON object"))
            return
        request_id = msg.get("request_id")
        if not isinstance(request_id, str) or not 0 < len(request_id) <= _MAX_REQUEST_ID:
            message = f"'request_id' must be a non-empty string of at most {_MAX_REQUEST_ID} chars"
            self.outbox_put(error_frame(None, "invalid_request", message, "request_id"))
            return
        match msg.get("type"):
            case "generate":
                self._generate(request_id, msg)
            case "cancel":
                # Cancelling a finished or unknown request is a harmless race: ignore it. The
                # engine answers with its Aborted event (full usage), which ends the pump.
                engine_id = self.engine_ids.get(request_id)
                if engine_id is not None:
                    self.cancelled.add(request_id)
                    abort = asyncio.create_task(
                        self.gateway.engine.abort(engine_id, "cancelled by client")
                    )
                    self._aborts.add(abort)
                    abort.add_done_callback(self._aborts.discard)
            case other:
                message = f"'type' must be 'generate' or 'cancel', got {other!r}"
                self.outbox_put(error_frame(request_id, "invalid_request", message, "type"))

    def _generate(self, request_id: str, msg: dict[str, Any]) -> None:
        def reject(message: str, field: str | None, code: str = "invalid_request") -> None:
            self.outbox_put(error_frame(request_id, code, message, field))

        if request_id in self.pumps:
            return reject(f"request_id {request_id!r} is already in flight", "request_id")
        if self.gateway.is_draining:
            return reject("the server is shutting down", None, "shutting_down")
        if len(self.pumps) >= self.gateway.settings.ws_max_requests:
            limit = self.gateway.settings.ws_max_requests
            return reject(f"at most {limit} requests in flight per socket", None, "overloaded")
        prompt: Any
        if ("prompt" in msg) == ("messages" in msg):
            return reject("send exactly one of 'prompt' or 'messages'", "prompt")
        if "prompt" in msg:
            prompt = msg["prompt"]
            if not isinstance(prompt, str) and not (
                isinstance(prompt, list) and all(type(t) is int for t in prompt)
            ):
                return reject("'prompt' must be a string or a list of token ids", "prompt")
        else:
            try:
                prompt = chat_messages(msg["messages"])
            except ApiError as exc:
                return reject(exc.message, exc.param)
        params = {k: v for k, v in msg.items() if k not in _RESERVED}
        self.pumps[request_id] = asyncio.create_task(self._run_request(request_id, prompt, params))
        return None

    async def _run_request(self, client_id: str, prompt: Any, params: dict[str, Any]) -> None:
        engine = self.gateway.engine
        # Unique per generate: a client may reuse its ids once a request has ended.
        self.num_started += 1
        engine_id = f"ws-{self.session_id}-{self.num_started}-{client_id}"
        self.engine_ids[client_id] = engine_id
        events = engine.generate(prompt, params, request_id=engine_id)
        self.gateway.stream_opened()
        loop = asyncio.get_running_loop()
        started = loop.time()
        token_times: list[float] = []  # first and latest token arrival, for a cancel's timings
        num_tokens = 0

        def encode(event: StreamEvent) -> Iterable[str]:
            nonlocal num_tokens
            if event.token_ids:
                num_tokens += len(event.token_ids)
                now = loop.time()
                if not token_times:
                    token_times.append(now)
                token_times[1:] = [now]
            frames: Iterable[str] = encode_event(client_id, event)
            return frames

        try:
            await pump(events, self.outbox, encode)
        except Overflow as exc:
            self._cut_off(exc)
        except asyncio.CancelledError:
            if client_id in self.cancelled and self.outbox.overflowed is None:
                # The engine's Aborted event went to a closed stream; answer from what we saw.
                done = {
                    "type": "done",
                    "request_id": client_id,
                    "finish_reason": "abort",
                    "reason": "cancelled by client",
                    "usage": {
                        "prompt_tokens": None,  # known only to the engine's Aborted event
                        "completion_tokens": num_tokens,
                        "total_tokens": None,
                        "cached_tokens": None,
                    },
                    "timings": {
                        "ttft": token_times[0] - started if token_times else None,
                        "tpot": (token_times[1] - token_times[0]) / (num_tokens - 1)
                        if num_tokens > 1
                        else None,
                        "e2e": loop.time() - started,
                    },
                }
                self.outbox_put(to_json(done))
            else:
                raise
        finally:
            self.gateway.stream_closed()
            self.pumps.pop(client_id, None)
            self.engine_ids.pop(client_id, None)
            self.cancelled.discard(client_id)
