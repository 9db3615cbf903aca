"""Admission core: checks lengths and sampling parameters, bounds the work in the engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import structlog
from troupe.actors.core.base import Outgoing
from troupe.actors.core.pooling_task import task_problem
from troupe.messages import (
    AbortRequest,
    AdmissionInbox,
    AdmittedRequest,
    ParamError,
    RejectCode,
    RequestFailed,
    RequestRejected,
    RequestsEnded,
    SamplingParams,
    TokenizedRequest,
)
from troupe.messages.samples import SAMPLE_SEP

log = structlog.get_logger("troupe.admission")


@dataclass(frozen=True)
class StreamingDefaults:
    """StreamingLLM settings: the engine's defaults for requests that do not say, and how long
    a streaming request may run (the runner's max_stream_len; 0: it cannot stream)."""

    window: int = 0
    sink_tokens: int = 4
    max_len: int = 0

    def resolve(self, params: SamplingParams) -> SamplingParams:
        """params with both fields set when the request streams (what the scheduler and the
        executor read); others unchanged (a recorded trace replays the same messages)."""
        window = self.window if params.streaming_window is None else params.streaming_window
        sinks = self.sink_tokens if params.sink_tokens is None else params.sink_tokens
        if not window or (params.streaming_window == window and params.sink_tokens == sinks):
            return params
        return msgspec.structs.replace(params, streaming_window=window, sink_tokens=sinks)


class AdmissionCore:
    """Inbox: TokenizedRequest, AbortRequest, RequestsEnded.
    Outboxes: "scheduler" (AdmittedRequest, AbortRequest), "streamer" (RequestRejected, or
    RequestFailed when handling one request raised: that request fails, admission goes on).

    Counts every admitted request until the Streamer reports its terminal event, and turns new
    work away with OVERLOADED once `max_num_seqs + max_queued_requests` requests or
    `max_queued_tokens` prompt tokens are in the engine. Rejections say which limit broke.
    """

    def __init__(
        self,
        *,
        max_model_len: int,
        vocab_size: int,
        max_num_seqs: int,
        max_queued_requests: int,
        max_queued_tokens: int,
        max_logprobs: int = 20,
        max_num_samples: int = 16,
        streaming: StreamingDefaults | None = None,
        samples_limit: str = "max_num_samples, capped by max_num_seqs",
        no_hidden_outputs: str | None = None,
        num_labels: int = 0,
        is_token_classifier: bool = False,
    ) -> None:
        """`samples_limit`: what sets max_num_samples, named in the rejection;
        `no_hidden_outputs`: why prompt logprobs and embeddings are refused (None: they are
        served); `num_labels`: a classification model's (0: a causal LM;
        actors/core/pooling_task.py), per token when `is_token_classifier`. A request's LoRA
        adapter was checked at the engine's edge
        (actors/lora_registry.py: adapters come and go while the engine runs)."""
        self.no_hidden_outputs = no_hidden_outputs
        self.num_labels = num_labels
        self.is_token_classifier = is_token_classifier
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.max_requests = max_num_seqs + max_queued_requests
        self.max_queued_tokens = max_queued_tokens
        self.max_logprobs = max_logprobs
        self.max_num_samples = max_num_samples  # n / best_of (capped by max_num_seqs)
        self.samples_limit = samples_limit
        self.streaming = streaming or StreamingDefaults()
        self._num_tokens: dict[str, int] = {}  # request id -> prompt tokens, while in the engine
        self._total_tokens = 0

    @property
    def num_in_flight(self) -> int:
        return len(self._num_tokens)

    def handle(self, batch: Sequence[AdmissionInbox]) -> Outgoing:
        out: Outgoing = []
        for msg in batch:
            match msg:
                case TokenizedRequest():
                    try:
                        out.append(self._admit(msg))
                    except Exception as exc:  # one bad request must not stop admission
                        log.exception("admission failed", request_id=msg.request_id)
                        message = f"admission failed on this request: {exc}"
                        out.append(
                            ("streamer", RequestFailed(request_id=msg.request_id, message=message))
                        )
                case AbortRequest():
                    out.append(("scheduler", msg))
                case RequestsEnded():
                    for request_id in msg.request_ids:
                        self._total_tokens -= self._num_tokens.pop(request_id, 0)
        return out

    def _admit(self, req: TokenizedRequest) -> tuple[str, RequestRejected | AdmittedRequest]:
        params = self.streaming.resolve(req.params)
        if params is not req.params:
            req = msgspec.structs.replace(req, params=params)
        problem = self._check(req)
        if problem is not None:
            code, field, message = problem
            return "streamer", RequestRejected(
                request_id=req.request_id, code=code, field=field, message=message
            )
        num_prompt = len(req.prompt_token_ids)
        # a streaming request's KV is bounded: only max_stream_len (checked) limits its length
        limit = self.streaming.max_len if req.params.is_streaming else self.max_model_len
        admitted = AdmittedRequest(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            params=req.params,
            arrival_time=req.arrival_time,
            max_total_tokens=min(num_prompt + req.params.max_tokens, limit),
            prompt_embeds=req.prompt_embeds,
            images=req.images,
        )
        # Counted only once nothing can fail: a failed request holds no share of the limits.
        self._num_tokens[req.request_id] = num_prompt
        self._total_tokens += num_prompt
        return "scheduler", admitted

    def _check(self, req: TokenizedRequest) -> tuple[RejectCode, str | None, str] | None:
        if req.request_id in self._num_tokens:
            return (
                RejectCode.INVALID_REQUEST,
                "request_id",
                f"request_id {req.request_id!r} is already in use",
            )
        if SAMPLE_SEP in req.request_id:
            message = "request_id must not contain U+001F (it names parallel samples)"
            return RejectCode.INVALID_REQUEST, "request_id", message
        try:
            req.params.check(max_logprobs=self.max_logprobs, vocab_size=self.vocab_size)
        except ParamError as exc:
            return RejectCode.INVALID_REQUEST, exc.field, str(exc)
        if (
            task := task_problem(req.params, self.num_labels, self.is_token_classifier)
        ) is not None:
            return RejectCode.INVALID_REQUEST, *task
        if req.params.num_samples > self.max_num_samples:
            field = "n" if req.params.best_of is None else "best_of"
            message = (
                f"{field} must be <= {self.max_num_samples} ({self.samples_limit}), "
                f"got {req.params.num_samples}"
            )
            return RejectCode.INVALID_REQUEST, field, message
        if self.no_hidden_outputs is not None:
            asked = (
                ("prompt_logprobs", req.params.prompt_logprobs),
                ("pooling", req.params.pooling),
            )
            for field, value in asked:
                if value is not None:
                    message = f"{field} is not served here: {self.no_hidden_outputs}"
                    return RejectCode.INVALID_REQUEST, field, message
        num_prompt = len(req.prompt_token_ids)
        if num_prompt == 0:
            return RejectCode.INVALID_REQUEST, "prompt", "prompt is empty"
        if num_prompt >= self.max_model_len:
            return (
                RejectCode.TOO_LONG,
                "prompt",
                f"prompt has {num_prompt} tokens; max_model_len is {self.max_model_len} "
                "(the prompt must leave room for at least one generated token)",
            )
        params = req.params
        if params.is_streaming:
            problem = self._check_streaming(params, num_prompt)
            if problem is not None:
                return RejectCode.INVALID_REQUEST, *problem
        elif params.strict_max_tokens and num_prompt + params.max_tokens > self.max_model_len:
            message = (
                f"prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) must be <= "
                f"max_model_len = {self.max_model_len}"
            )
            return RejectCode.TOO_LONG, "max_tokens", message
        if len(self._num_tokens) >= self.max_requests:
            return (
                RejectCode.OVERLOADED,
                None,
                f"overloaded: {len(self._num_tokens)} requests in flight "
                f"(limit max_num_seqs + max_queued_requests = {self.max_requests})",
            )
        if self._total_tokens + num_prompt > self.max_queued_tokens:
            return (
                RejectCode.OVERLOADED,
                None,
                f"overloaded: {self._total_tokens} prompt tokens in flight; "
                f"adding {num_prompt} would pass max_queued_tokens = {self.max_queued_tokens}",
            )
        return None

    def _check_streaming(self, params: SamplingParams, num_prompt: int) -> tuple[str, str] | None:
        """(field, message) when a streaming request cannot run here."""
        max_len = self.streaming.max_len
        if max_len == 0:
            return "streaming_window", (
                "streaming_window (StreamingLLM) is not supported by this engine: it needs the "
                "CPU (torch) attention path and a model without sliding windows, MLA, tensor "
                "parallelism or a draft model"
            )
        if num_prompt + params.max_tokens > max_len:
            return "max_tokens", (
                f"prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) must be <= "
                f"streaming_max_len = {max_len} for a streaming request"
            )
        return None
