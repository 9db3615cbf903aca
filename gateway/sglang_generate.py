"""SGLang's native POST /generate, for clients written against SGLang's server (RL rollout
workers read `meta_info.output_token_logprobs` and `finish_reason.type` from it).

    whole:     {"text", "output_ids", "meta_info"}, or a list of them for a batch of prompts
               or n > 1 (prompt-major: prompt i's sample j is entry i * n + j)
    streamed:  SSE chunks `data: {...}`, each with the text and output_ids so far (SGLang's
               default, non-incremental output; --incremental-streaming-output: only the
               chunk's own, and its own logprob rows) and its meta_info, plus "index" for a
               batch or n > 1; then `data: [DONE]`. A failure mid-stream is a chunk {"error"}.
    meta_info: id (the client's rid, else a fresh one; "-j" after it for sample j when
               n > 1), finish_reason (null until the end, then {"type": "stop", "matched":
               the stop string or token id}, {"type": "length", "length": n}), prompt_tokens,
               completion_tokens, cached_tokens, e2e_latency (at the end; max_new_tokens 0,
               SGLang's prefill-only call, shows no output: length 0); with
               return_logprob: output_token_logprobs ([logprob, token_id, text or null] each;
               text with return_text_in_logprobs), output_top_logprobs (top_logprobs_num > 0),
               and from logprob_start_len on the prompt's input_token_logprobs and
               input_top_logprobs (the first prompt token's logprob is null).

Bodies: gateway/sglang_bodies.py. Behind the API key as /v1/* is; through the router too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
from aiohttp import web
from troupe.gateway.completion_logprobs import TokenTexts
from troupe.gateway.errors import ApiError, error_for_event, invalid
from troupe.gateway.http_body import read_json_body
from troupe.gateway.outbox import Outbox
from troupe.gateway.prompt_batch import batch_events, prompt_request_ids
from troupe.gateway.sglang_bodies import (
    CLIENT_FIELDS,
    GenerateCall,
    in_sglang_terms,
    parse_generate,
)
from troupe.gateway.sse_frames import DONE, sse
from troupe.gateway.sse_writer import first_event, pump_sse, serve_sse
from troupe.gateway.state import GATEWAY, Gateway
from troupe.messages import Aborted, Delta, Failed, Finished, Rejected, StreamEvent, TokenLogprob

PATH = "/generate"
_json = msgspec.json.Encoder()


class RunningRids:
    """The engine request ids of the /generate calls in flight, by rid (SGLang's
    /abort_request names them so)."""

    def __init__(self) -> None:
        self._ids: dict[str, set[str]] = defaultdict(set)

    @contextlib.contextmanager
    def hold(self, pairs: Iterable[tuple[str, str]]) -> Iterator[None]:
        """(rid, engine request id) pairs, known while the block runs."""
        pairs = list(pairs)
        for rid, engine_id in pairs:
            self._ids[rid].add(engine_id)
        try:
            yield
        finally:
            for rid, engine_id in pairs:
                self._ids[rid].discard(engine_id)
                if not self._ids[rid]:
                    del self._ids[rid]

    def engine_ids(self, rid: str) -> list[str]:
        return sorted(self._ids.get(rid, ()))


RIDS = web.AppKey("sglang_rids", RunningRids)


def add_generate_route(app: web.Application) -> None:
    app[RIDS] = RunningRids()
    app.router.add_post(PATH, generate)


async def generate(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    engine = gateway.engine
    call = parse_generate(await read_json_body(request, gateway.settings), engine.sampling_defaults)
    call = _on_adapter(gateway, call)
    rids = call.rids or [uuid.uuid4().hex for _ in call.prompts]
    texts = TokenTexts(engine.tokenizer, skip_special_tokens=False)
    incremental = gateway.settings.incremental_streaming_output
    answer = _Answer(call, rids, texts, incremental=incremental)
    field = "text" if isinstance(call.prompts[0], str) else "input_ids"
    engine_id = f"generate-{uuid.uuid4().hex}"
    ids = prompt_request_ids(engine_id, len(rids))
    with request.app[RIDS].hold(zip(rids, ids, strict=True)):
        events = batch_events(engine, call.prompts, call.params, engine_id, field=field)
        if not call.stream:
            body = await _whole(events, answer)
            return web.json_response(body, dumps=lambda o: _json.encode(o).decode())
        return await _stream(request, gateway, events, answer, engine_id)


async def _stream(
    request: web.Request, gateway: Gateway, events: Any, answer: _Answer, engine_id: str
) -> web.StreamResponse:
    try:
        first = await first_event(events, CLIENT_FIELDS, abort_answers=True)
    except ApiError as exc:
        raise in_sglang_terms(exc) from None
    gateway.stream_opened()
    try:

        async def fill(outbox: Outbox, on_overflow: Any) -> None:
            def encode(event: StreamEvent) -> Iterable[str]:
                if isinstance(event, Delta | Finished | Aborted):
                    yield sse(answer.see(event, streamed=True))
                else:  # a sample failed mid-stream
                    yield sse(_error(event).body())
                if event.is_terminal:
                    yield DONE

            await pump_sse(events, outbox, encode, first, on_overflow)

        return await serve_sse(request, gateway.settings, fill, engine_id)
    finally:
        gateway.stream_closed()


def _on_adapter(gateway: Gateway, call: GenerateCall) -> GenerateCall:
    """The call's params on the LoRA adapter `lora_path` names (a 400 naming it if none)."""
    if call.lora_path is None:
        return call
    try:
        lora = gateway.served_models().lora_for(call.lora_path)
    except ApiError as exc:
        raise invalid("lora_path", exc.message) from None
    params = [msgspec.structs.replace(p, lora=lora) for p in call.params]
    return dataclasses.replace(call, params=params)


async def _whole(events: Any, answer: _Answer) -> Any:
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, Rejected | Failed):
                raise _error(event)  # one sample's failure fails all
            answer.see(event, streamed=False)
            if event.is_terminal:
                return answer.whole()
    raise ApiError(500, "the engine ended the stream without a terminal event")


def _error(event: Rejected | Failed) -> ApiError:
    return in_sglang_terms(error_for_event(event, CLIENT_FIELDS))


class _Sample:
    """One sample's output so far."""

    def __init__(self, sample_id: str) -> None:
        self.text: list[str] = []
        self.output_ids: list[int] = []
        self.logprobs: list[list[Any]] = []
        self.top: list[list[list[Any]]] = []
        self.meta: dict[str, Any] = {"id": sample_id, "finish_reason": None}


class _Answer:
    """Every sample of one /generate call, and their SGLang output dicts."""

    def __init__(
        self, call: GenerateCall, rids: list[str], texts: TokenTexts, *, incremental: bool
    ) -> None:
        self._call = call
        self._texts = texts
        self._incremental = incremental  # a streamed chunk carries only its own output
        n = call.n
        self._samples = [_Sample(rid if n == 1 else f"{rid}-{j}") for rid in rids for j in range(n)]
        self._prompt_tokens: dict[int, int] = {}  # per prompt, once known

    def see(self, event: Delta | Finished | Aborted, *, streamed: bool) -> dict[str, Any]:
        """Take in one event of sample `event.index`; its output dict so far."""
        call, index = self._call, event.index
        sample, prompt = self._samples[index], index // call.n
        num_rows = len(sample.logprobs)
        if not call.is_prompt_only:
            sample.text.append(event.text)
            sample.output_ids.extend(event.token_ids)
        if isinstance(event, Delta | Finished):
            self._take_logprobs(sample, event)
            if isinstance(event, Delta) and event.prompt_tokens is not None:
                self._prompt_tokens[prompt] = event.prompt_tokens
        meta = sample.meta
        meta["prompt_tokens"] = self._prompt_tokens.get(prompt, 0)
        meta["completion_tokens"] = len(sample.output_ids)
        meta.setdefault("cached_tokens", 0)
        if isinstance(event, Finished | Aborted):
            self._prompt_tokens[prompt] = meta["prompt_tokens"] = event.usage.prompt_tokens
            if isinstance(event, Aborted):
                meta["finish_reason"] = {"type": "abort", "message": event.reason}
            elif call.is_prompt_only:
                meta["finish_reason"] = {"type": "length", "length": 0}
            else:
                meta["finish_reason"] = _finish_reason(event, sample.output_ids)
            meta["cached_tokens"] = event.usage.cached_tokens
            meta["e2e_latency"] = event.timings.e2e
        if call.return_logprob:
            meta["output_token_logprobs"] = sample.logprobs
            if call.top_logprobs_num:
                meta["output_top_logprobs"] = sample.top
        out: dict[str, Any]
        if streamed and self._incremental:  # this event's own text, ids and rows
            out = {
                "text": "" if call.is_prompt_only else event.text,
                "output_ids": [] if call.is_prompt_only else list(event.token_ids),
                "meta_info": {**meta, **self._rows_from(sample, num_rows)},
            }
        else:
            out = self._output(sample)
        if streamed and (call.is_batch or call.n > 1):
            out["index"] = index
        return out

    def whole(self) -> Any:
        outputs = [self._output(s) for s in self._samples]
        return outputs if self._call.is_batch or self._call.n > 1 else outputs[0]

    def _rows_from(self, sample: _Sample, start: int) -> dict[str, Any]:
        """The sample's output logprob rows from row `start` on, as meta_info holds them."""
        if not self._call.return_logprob:
            return {}
        rows: dict[str, Any] = {"output_token_logprobs": sample.logprobs[start:]}
        if self._call.top_logprobs_num:
            rows["output_top_logprobs"] = sample.top[start:]
        return rows

    def _output(self, sample: _Sample) -> dict[str, Any]:
        text = "".join(sample.text)
        sample.text = [text]
        return {"text": text, "output_ids": list(sample.output_ids), "meta_info": sample.meta}

    def _take_logprobs(self, sample: _Sample, event: Delta | Finished) -> None:
        call = self._call
        if event.prompt_token_ids is not None and call.logprob_start_len >= 0:
            self._prompt_rows(sample, event.prompt_token_ids, event.prompt_logprobs or ())
        if call.return_logprob and not call.is_prompt_only:
            for row in event.logprobs or ():
                sample.logprobs.append(self._row(row.token_id, row.logprob))
                if call.top_logprobs_num:
                    sample.top.append([self._row(t, lp) for t, lp in row.top])

    def _prompt_rows(
        self, sample: _Sample, ids: tuple[int, ...], rows: tuple[TokenLogprob, ...]
    ) -> None:
        start = self._call.logprob_start_len
        tokens = [self._row(ids[0], None), *(self._row(r.token_id, r.logprob) for r in rows)]
        sample.meta["input_token_logprobs"] = tokens[start:]
        if self._call.top_logprobs_num:
            tops = [None, *([self._row(t, lp) for t, lp in r.top] for r in rows)]
            sample.meta["input_top_logprobs"] = tops[start:]

    def _row(self, token_id: int, logprob: float | None) -> list[Any]:
        text = self._texts(token_id) if self._call.return_text_in_logprobs else None
        return [logprob, token_id, text]


def _finish_reason(event: Finished, output_ids: list[int]) -> dict[str, Any]:
    if str(event.finish_reason) == "length":
        return {"type": "length", "length": len(output_ids)}
    matched = event.stop_reason  # None at the model's EOS: SGLang names the token
    if matched is None and output_ids:
        matched = output_ids[-1]
    return {"type": "stop", "matched": matched}
