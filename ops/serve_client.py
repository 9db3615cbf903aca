"""Send one benchmark request and time what comes back: over HTTP (OpenAI SSE) or in-process.

`HttpClient` posts to /v1/completions with `stream: true`, the prompt as token ids, `ignore_eos`
(vLLM's extra field, which troupe's gateway takes too) and `stream_options.include_usage`, so
output tokens are counted by the server. `EngineClient` runs the same request through
`Engine.generate` in this process: the difference between the two is the gateway's share.

A request with a schema (serve_workload's structured share) asks for it as OpenAI's
`response_format` json_schema (in-process: SamplingParams.structured_outputs) and never
`ignore_eos` (its grammar ends the output); its text is kept and `json_valid` says whether it
parses (one cut by max_tokens does not).

Stamps follow vLLM's benchmark client: the clock starts just before the request is sent; every
chunk with a non-empty `choices` list is a content chunk; the first sets TTFT, each later one
adds a gap to ITL, the last one ends the E2E latency. In-process, a content chunk is an event
carrying tokens, or the terminal Finished (the gateway always sends a chunk for that one).

How the body is read (`sse_read`): "events", as vLLM's client does now (`iter_any`, cut into SSE
events at blank lines): one await per socket read, each event stamped as it is processed, so
events that came in one read are microseconds apart; "lines": one await per line (two per
event), which made the client's own loop the bottleneck of a 300-request burst (py-spy: ~55%
of its time in aiohttp's readline).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import aiohttp
import msgspec
from troupe.ops.serve_metrics import RequestResult
from troupe.ops.serve_workload import BenchRequest

# msgspec, not json: the client's own CPU time must not cap what it measures
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


SseRead = Literal["events", "lines"]


async def read_sse_data(
    content: aiohttp.StreamReader, how: SseRead, on_data: Callable[[bytes], bool]
) -> None:
    """Call `on_data` with each SSE event's data field (stripped) in order, until it returns
    False or the body ends; see the module doc for `how`."""
    if how == "lines":
        async for raw in content:
            if not _each_data([raw.strip()], on_data):
                return
        return
    pending = b""
    async for data in content.iter_any():
        pending += data
        if b"\r" in pending:  # CRLF line ends (the SSE spec allows them)
            pending = pending.replace(b"\r\n", b"\n")
        complete, end, pending = pending.rpartition(b"\n\n")  # whole events, the rest
        if end and not _each_data(complete.split(b"\n"), on_data):
            return
    _each_data(pending.split(b"\n"), on_data)  # an event the body ended without a blank line


def _each_data(lines: list[bytes], on_data: Callable[[bytes], bool]) -> bool:
    """`on_data` for each `data:` line, in order; False once it asks to stop."""
    return all(on_data(line[5:].strip()) for line in lines if line.startswith(b"data:"))


class Client(Protocol):
    async def send(self, req: BenchRequest) -> RequestResult: ...


class _Stamps:
    """TTFT, ITL and latency from the arrival times of content chunks."""

    def __init__(self, result: RequestResult) -> None:
        self.result = result
        self.num_chunks = 0
        self.start = self.last = result.start = time.perf_counter()

    def chunk(self) -> None:
        now = time.perf_counter()
        if self.num_chunks == 0:
            self.result.ttft = now - self.start
        else:
            self.result.itl.append(now - self.last)
        self.last = now
        self.num_chunks += 1
        self.result.latency = now - self.start


class HttpClient:
    """Streams completions from an OpenAI-compatible server (troupe's, or another's)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        model: str | None,
        temperature: float,
        ignore_eos: bool,
        api_key: str | None = None,
        sse_read: SseRead = "events",
        sampling: Mapping[str, float] | None = None,
    ) -> None:
        self.session = session
        self.sse_read = sse_read
        self.sampling = dict(sampling or {})  # top_p, top_k, ...: sent as given
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model = model
        self.temperature = temperature
        self.ignore_eos = ignore_eos
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    async def send(self, req: BenchRequest) -> RequestResult:
        body: dict[str, Any] = {
            "prompt": req.prompt_ids,
            "max_tokens": req.output_len,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos and req.schema is None,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.sampling,
        }
        if req.schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": f"bench_{req.index}", "schema": req.schema},
            }
        if self.model:
            body["model"] = self.model
        result = RequestResult(prompt_len=req.input_len)
        stamps = _Stamps(result)
        usage_tokens: int | None = None
        texts: list[str] | None = None if req.schema is None else []

        def on_data(data: bytes) -> bool:
            nonlocal usage_tokens
            if data == b"[DONE]":
                return True
            chunk = _decode(data)
            if not isinstance(chunk, dict):
                raise msgspec.DecodeError(f"not a JSON object: {data[:80]!r}")
            if "error" in chunk:
                result.error = str(chunk["error"].get("message", chunk["error"]))[:300]
                return False
            choices = chunk.get("choices")
            if choices:
                stamps.chunk()
                if texts is not None:
                    texts.append(choices[0].get("text") or "")
            usage = chunk.get("usage")
            if usage:
                usage_tokens = usage.get("completion_tokens")
                result.prompt_len = usage.get("prompt_tokens", result.prompt_len)
            return True

        try:
            body_bytes = _encode(body)
            async with self.session.post(self.url, data=body_bytes, headers=self.headers) as resp:
                if resp.status != 200:
                    result.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    return result
                await read_sse_data(resp.content, self.sse_read, on_data)
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:300]
            return result
        if result.error:
            return result
        if stamps.num_chunks == 0:
            result.error = "the stream held no content chunk"
            return result
        # Without usage (a server that ignores include_usage) chunks stand in for tokens.
        result.output_tokens = usage_tokens if usage_tokens is not None else stamps.num_chunks
        result.success = True
        if texts is not None:
            result.json_valid = parses_as_json("".join(texts))
        return result


class EngineClient:
    """The same requests through `Engine.generate`: no HTTP, no SSE, no JSON."""

    def __init__(
        self,
        engine: Any,
        *,
        temperature: float,
        ignore_eos: bool,
        sampling: Mapping[str, float] | None = None,
    ) -> None:
        self.engine = engine
        self.temperature = temperature
        self.ignore_eos = ignore_eos
        self.sampling = dict(sampling or {})

    async def send(self, req: BenchRequest) -> RequestResult:
        from troupe.messages import Delta, Finished, SamplingParams, StructuredOutputs

        structured = None if req.schema is None else StructuredOutputs.from_schema(req.schema)
        fields: dict[str, Any] = {
            "max_tokens": req.output_len,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos and structured is None,
            "structured_outputs": structured,
            **self.sampling,  # top_p, ...: the same names as the OpenAI fields
        }
        params = SamplingParams(**fields)
        result = RequestResult(prompt_len=req.input_len)
        stamps = _Stamps(result)
        texts: list[str] | None = None if structured is None else []
        async for event in self.engine.generate(req.prompt_ids, params):
            if texts is not None:
                texts.append(event.text)
            if isinstance(event, Delta):
                if event.token_ids:
                    stamps.chunk()
            elif isinstance(event, Finished):
                stamps.chunk()
                result.output_tokens = event.usage.completion_tokens
                result.prompt_len = event.usage.prompt_tokens
                result.success = True
            else:
                result.error = f"{type(event).__name__}: {getattr(event, 'message', '')}"[:300]
        if texts is not None and result.success:
            result.json_valid = parses_as_json("".join(texts))
        return result


def parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
