"""The soak workload: requests of every kind a client sends, each followed to its one ending.

Kinds (`DEFAULT_MIX` gives their shares):

    completion, chat                 POST JSON: a finish_reason, or an error body
    completion_stream, chat_stream   SSE: one finish_reason or error chunk, then one [DONE]
    http_cut                         SSE, the client closes the connection after a few chunks
    http_disconnect                  POST JSON, the client hangs up before the answer
    ws                               generate on a shared socket: one done or error frame
    ws_cancel                        the same, with a cancel frame after a few deltas
    ws_close                         own socket, closed by the client mid-stream
    invalid                          bad sampling parameters: an error is the right ending
    oversize                         a prompt far over max_model_len: an error again

A cut or a hang-up is the deliberate ending of its request; the server must still free what
the request held, which the checks read from /metrics afterwards. Websocket terminal frames are
counted per request id for the socket's whole life, so a second `done` after the first is seen;
each shared socket ends with a sentinel request, answered after the frames before it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from troupe.ops.soak_checks import Outcome

DEFAULT_MIX: Mapping[str, float] = {
    "completion": 10,
    "completion_stream": 12,
    "chat": 8,
    "chat_stream": 12,
    "http_cut": 12,
    "http_disconnect": 6,
    "ws": 22,
    "ws_cancel": 8,
    "ws_close": 4,
    "invalid": 4,
    "oversize": 2,
}
_WORDS = "the of and a to in is you that it he was for on are as with his they at be this".split()
_STREAMED = ("completion_stream", "chat_stream", "http_cut")


@dataclass(frozen=True)
class Spec:
    """One planned request."""

    index: int
    kind: str
    prompt: str
    max_tokens: int
    cut_after: int  # deltas read before a cut or cancel; x10 ms before an HTTP hang-up

    @property
    def request_id(self) -> str:
        return f"soak-{self.index}"


def make_specs(num_requests: int, seed: int, mix: Mapping[str, float] = DEFAULT_MIX) -> list[Spec]:
    """`num_requests` specs drawn from `mix` (kinds are shuffled, so every run mixes them)."""
    rng = random.Random(seed)
    kinds = rng.choices(list(mix), weights=list(mix.values()), k=num_requests)
    specs = []
    for index, kind in enumerate(kinds):
        prompt = " ".join(rng.choices(_WORDS, k=rng.randint(3, 200)))
        max_tokens = rng.randint(1, 48)
        if kind in ("http_cut", "ws_cancel", "ws_close", "http_disconnect"):
            max_tokens = rng.randint(32, 128)  # long enough to be cut mid-stream
        specs.append(Spec(index, kind, prompt, max_tokens, cut_after=rng.randint(0, 4)))
    return specs


class Workload:
    """Runs specs against `base_url`, `concurrency` at a time; returns one Outcome each."""

    def __init__(
        self,
        base_url: str,
        *,
        concurrency: int = 32,
        num_sockets: int = 4,
        request_timeout: float = 60.0,
        oversize_bytes: int = 1_000_000,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.concurrency = concurrency
        self.num_sockets = num_sockets
        self.request_timeout = request_timeout
        # One body for every oversize request: ~oversize_bytes of prose, encoded once.
        words = " ".join(_WORDS) + " "
        text = words * (oversize_bytes // len(words) + 1)
        self._oversize_body = json.dumps({"prompt": text, "max_tokens": 4}).encode()

    async def run(self, specs: list[Spec]) -> list[Outcome]:
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            sockets = [
                _Socket(await session.ws_connect(f"{self.base_url}/v1/ws"))
                for _ in range(self.num_sockets)
            ]
            readers = [asyncio.create_task(s.read_all()) for s in sockets]
            pending = iter(specs)
            outcomes: dict[int, Outcome] = {}

            async def worker() -> None:
                for spec in pending:
                    outcomes[spec.index] = await self._timed(session, sockets, spec)

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))
            for index, sock in enumerate(sockets):
                await sock.finish(f"sentinel-{index}", self.request_timeout)
            for reader in readers:
                await reader
        # Terminal frames are counted over each socket's life: a late second `done` shows.
        counts: collections.Counter[str] = collections.Counter()
        for sock in sockets:
            counts.update(sock.num_terminal)
        for spec in specs:
            outcome = outcomes[spec.index]
            if spec.kind in ("ws", "ws_cancel") and counts[spec.request_id] > 1:
                outcomes[spec.index] = Outcome(
                    outcome.kind,
                    outcome.ending,
                    counts[spec.request_id],
                    outcome.seconds,
                    "terminal frames after the first",
                )
        return [outcomes[spec.index] for spec in specs]

    async def _timed(
        self, session: aiohttp.ClientSession, sockets: list[_Socket], spec: Spec
    ) -> Outcome:
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.request_timeout):
                ending, num_terminal, detail = await self._one(session, sockets, spec)
        except TimeoutError:
            ending, num_terminal, detail = "lost", 0, f"no ending in {self.request_timeout:g} s"
        except (aiohttp.ClientError, ValueError, KeyError) as exc:
            ending, num_terminal, detail = "lost", 0, f"{type(exc).__name__}: {exc}"
        return Outcome(spec.kind, ending, num_terminal, time.perf_counter() - start, detail)

    async def _one(
        self, session: aiohttp.ClientSession, sockets: list[_Socket], spec: Spec
    ) -> tuple[str, int, str]:
        kind = spec.kind
        if kind in ("ws", "ws_cancel"):
            sock = sockets[spec.index % len(sockets)]
            return await sock.request(spec, cancel=kind == "ws_cancel")
        if kind == "ws_close":
            return await self._ws_close(session, spec)
        chat = kind.startswith("chat")
        url = f"{self.base_url}/v1/{'chat/completions' if chat else 'completions'}"
        body: dict[str, Any] = {"max_tokens": spec.max_tokens, "temperature": 0.0}
        if chat:
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = spec.prompt
        if kind == "invalid":
            body["max_tokens"] = -spec.max_tokens
            return _expect_error(await _post_json(session, url, json.dumps(body).encode()))
        if kind == "oversize":
            return _expect_error(await _post_json(session, url, self._oversize_body))
        if kind == "http_disconnect":
            post = asyncio.create_task(_post_json(session, url, json.dumps(body).encode()))
            done, _ = await asyncio.wait({post}, timeout=spec.cut_after / 100)
            if not done:
                post.cancel()  # closes the connection: the server must abort the request
                with contextlib.suppress(asyncio.CancelledError):
                    await post
                return "cut", 0, ""
            return post.result()
        if kind in _STREAMED:
            body["stream"] = True
            cut = max(1, spec.cut_after) if kind == "http_cut" else None
            return await _post_sse(session, url, body, cut)
        return await _post_json(session, url, json.dumps(body).encode())

    async def _ws_close(self, session: aiohttp.ClientSession, spec: Spec) -> tuple[str, int, str]:
        async with session.ws_connect(f"{self.base_url}/v1/ws") as ws:
            await ws.send_str(json.dumps(_generate_frame(spec)))
            num_deltas = 0
            async for msg in ws:
                frame = json.loads(msg.data)
                if frame["type"] in ("done", "error"):
                    return _frame_ending(frame)
                num_deltas += 1
                if num_deltas >= max(1, spec.cut_after):
                    return "cut", 0, ""  # leaving the block closes the socket
        return "lost", 0, "socket closed before the request ended"


class _Socket:
    """One shared websocket: routes frames to their requests and counts terminal frames."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.inboxes: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.num_terminal: collections.Counter[str] = collections.Counter()

    async def read_all(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            frame = json.loads(msg.data)
            request_id = frame.get("request_id")
            if frame.get("type") in ("done", "error"):
                self.num_terminal[request_id] += 1
            inbox = self.inboxes.get(request_id)
            if inbox is not None:
                inbox.put_nowait(frame)

    async def request(self, spec: Spec, *, cancel: bool) -> tuple[str, int, str]:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inboxes[spec.request_id] = inbox
        try:
            await self.ws.send_str(json.dumps(_generate_frame(spec)))
            if cancel and spec.cut_after == 0:  # before the server has even started it
                await self._cancel(spec.request_id)
            num_deltas = 0
            while True:
                frame = await inbox.get()
                if frame["type"] in ("done", "error"):
                    return _frame_ending(frame)
                num_deltas += 1
                if cancel and num_deltas == spec.cut_after:
                    await self._cancel(spec.request_id)
        finally:
            del self.inboxes[spec.request_id]

    async def finish(self, sentinel_id: str, timeout: float) -> None:
        """A last request, then close: its answer comes after every earlier frame was read."""
        spec = Spec(-1, "ws", "sentinel", 1, 0)
        frame = _generate_frame(spec) | {"request_id": sentinel_id}
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inboxes[sentinel_id] = inbox
        await self.ws.send_str(json.dumps(frame))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while (await inbox.get())["type"] not in ("done", "error"):
                    pass
        await self.ws.close()

    async def _cancel(self, request_id: str) -> None:
        await self.ws.send_str(json.dumps({"type": "cancel", "request_id": request_id}))


def _generate_frame(spec: Spec) -> dict[str, Any]:
    return {
        "type": "generate",
        "request_id": spec.request_id,
        "prompt": spec.prompt,
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
    }


def _frame_ending(frame: dict[str, Any]) -> tuple[str, int, str]:
    if frame["type"] == "error":
        return "error", 1, str(frame.get("code"))
    finish = str(frame.get("finish_reason"))
    return ("aborted" if finish == "abort" else "finished"), 1, finish


def _expect_error(result: tuple[str, int, str]) -> tuple[str, int, str]:
    ending, num_terminal, detail = result
    if ending == "finished":
        return "lost", num_terminal, f"expected an error, got finish_reason {detail}"
    return result


async def _post_json(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[str, int, str]:
    headers = {"Content-Type": "application/json"}
    async with session.post(url, data=body, headers=headers) as resp:
        obj = await resp.json(content_type=None)
    if resp.status == 200:
        finish = obj["choices"][0].get("finish_reason")
        if finish:
            return "finished", 1, str(finish)
        return "lost", 0, "200 without a finish_reason"
    return "error", 1, str(obj["error"].get("code"))


async def _post_sse(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], cut: int | None
) -> tuple[str, int, str]:
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            obj = await resp.json(content_type=None)
            return "error", 1, str(obj["error"].get("code"))
        num_terminal = num_done = num_chunks = 0
        ending, detail, data_after_done = "finished", "", False
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: ") :]
            data_after_done |= num_done > 0
            if data == b"[DONE]":
                num_done += 1
                continue
            chunk = json.loads(data)
            num_chunks += 1
            if "error" in chunk:
                num_terminal += 1
                ending, detail = "error", str(chunk["error"].get("code"))
            elif chunk["choices"] and chunk["choices"][0].get("finish_reason"):
                num_terminal += 1
                detail = str(chunk["choices"][0]["finish_reason"])
            if cut is not None and num_chunks >= cut and num_terminal == 0:
                resp.close()  # the client goes away mid-stream
                return "cut", 0, ""
    if num_terminal == 1 and num_done == 1 and not data_after_done:
        return ending, 1, detail
    # A stream must end with its terminal chunk, then [DONE], then nothing.
    return "lost", num_terminal, f"{num_terminal} terminal chunks, {num_done} [DONE]"
