"""StreamerCore: token ids in, per-request text events out.

Inbox -> outboxes, per handle() call:
    RequestOpened    -> per-request state (detokenizer, stop matcher, counters); nothing sent
    RequestRejected  -> ("client", StreamBatch([Rejected]))
    RequestFailed    -> ("client", StreamBatch([Failed]))
    TokenBatch       -> ("scheduler", StopRequests) when stop strings matched, then
                        ("client", StreamBatch) -- exactly one per TokenBatch, with its stats
    at the end       -> ("admission", RequestsEnded) with every request that ended in this call

Every request gets exactly one terminal event (Finished, Rejected, Aborted or Failed); after it
the request's state is gone and later outputs naming it are ignored. Timings come from the
engine-stamped times in the messages, never from a clock, so a replay reproduces them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import msgspec
import structlog
from troupe.actors.core.detokenizer import IncrementalDetokenizer, shared_token_texts
from troupe.actors.core.first_extras import FirstExtras
from troupe.actors.core.sample_streams import SampleFamily
from troupe.actors.core.stop_strings import StopStringMatcher
from troupe.actors.core.streamer_timings import request_timings
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.messages import (
    Aborted,
    Delta,
    Failed,
    Finished,
    FinishReason,
    Rejected,
    RequestFailed,
    RequestOpened,
    RequestRejected,
    RequestsEnded,
    SeqOutput,
    StopRequests,
    StreamBatch,
    StreamerInbox,
    StreamEvent,
    Timings,
    TokenBatch,
    Usage,
)
from troupe.messages.samples import sample_id

log = structlog.get_logger("troupe.streamer")


@dataclasses.dataclass(slots=True)
class _Stream:
    """One live request."""

    opened: RequestOpened
    detokenizer: IncrementalDetokenizer
    stops: StopStringMatcher
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    scheduled_time: float | None = None  # first scheduled (TokenBatch.first_scheduled)
    index: int = 0  # its sample (parallel sampling)
    family: SampleFamily | None = None  # the request's samples, when it has several
    has_stops: bool = dataclasses.field(init=False)  # False: the per-token fast path applies

    def __post_init__(self) -> None:
        self.has_stops = bool(self.opened.params.stop)

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.opened.num_prompt_tokens,
            completion_tokens=self.num_output_tokens,
            cached_tokens=self.num_cached_tokens,
        )

    def timings(self, end_time: float) -> Timings:
        return request_timings(
            arrival=self.opened.arrival_time,
            scheduled=self.scheduled_time,
            first_token=self.first_token_time,
            last_token=self.last_token_time,
            num_output_tokens=self.num_output_tokens,
            end=end_time,
        )

    def final_text(self) -> str:
        """What is still held back when the request ends: incomplete bytes (as U+FFFD, like
        decode) and a partial stop-string match that never completed."""
        tail: str = self.stops.feed(self.detokenizer.flush())
        return tail if self.stops.matched is not None else tail + self.stops.flush()


class StreamerCore:
    """Pure core of the Streamer actor."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer
        self._streams: dict[str, _Stream] = {}
        self._failed: dict[str, str] = {}  # request id -> why its stream could not be opened
        self._families: dict[str, SampleFamily] = {}  # request id -> its samples (n > 1)
        self._extras = FirstExtras()  # prompt logprobs, embeddings, prompt ids: on first events
        tokenizer.token_bytes(0)  # build the byte table now, not on the first token batch
        # Decoded text per token id, shared by all requests (one table per skip setting).
        self._texts = {
            skip: shared_token_texts(tokenizer, skip_special_tokens=skip) for skip in (False, True)
        }

    @property
    def num_live_requests(self) -> int:
        return len(self._streams)

    def handle(self, batch: Sequence[StreamerInbox]) -> list[tuple[str, msgspec.Struct]]:
        """Process inbox messages in order; return (outbox, message) pairs in send order."""
        out: list[tuple[str, msgspec.Struct]] = []
        ended: list[str] = []
        for msg in batch:
            if isinstance(msg, RequestOpened):
                self._open(msg)
            elif isinstance(msg, RequestRejected | RequestFailed):
                self._streams.pop(msg.request_id, None)
                family = self._families.pop(msg.request_id, None)
                for sample in family.open if family is not None else ():
                    self._streams.pop(sample, None)
                self._failed.pop(msg.request_id, None)
                event: StreamEvent = (
                    Rejected(
                        request_id=msg.request_id,
                        code=msg.code,
                        message=msg.message,
                        field=msg.field,
                    )
                    if isinstance(msg, RequestRejected)
                    else Failed(request_id=msg.request_id, message=msg.message)
                )
                out.append(("client", StreamBatch(events=(event,))))
                ended.append(msg.request_id)
            else:
                out.extend(self._tokens(msg, ended))
        if ended:
            self._extras.forget(ended)
            out.append(("admission", RequestsEnded(request_ids=tuple(ended))))
        return out

    def _open(self, msg: RequestOpened) -> None:
        try:
            params = msg.params
            self._extras.open(msg)
            if params.num_samples == 1:
                self._streams[msg.request_id] = self._new_stream(msg)
                return
            ids = [sample_id(msg.request_id, i) for i in range(params.num_samples)]
            ranks = params.num_samples > params.n
            family = SampleFamily(
                ids, params.n, ranks=ranks, keeps_logprobs=params.logprobs is not None
            )
            for i, sample in enumerate(ids):
                stream = self._streams[sample] = self._new_stream(msg)
                stream.index, stream.family = i, family
            self._families[msg.request_id] = family
        except Exception as exc:  # one bad request must not stop the streamer
            log.exception("cannot open the request's stream", request_id=msg.request_id)
            # It fails at its first output: by then the scheduler knows it and can free it.
            self._failed[msg.request_id] = f"the streamer could not open this request: {exc}"

    def _new_stream(self, msg: RequestOpened) -> _Stream:
        params = msg.params
        return _Stream(
            opened=msg,
            detokenizer=IncrementalDetokenizer(
                self._tokenizer,
                skip_special_tokens=params.skip_special_tokens,
                texts=self._texts[params.skip_special_tokens],
            ),
            stops=StopStringMatcher(
                params.stop, include_in_output=params.include_stop_str_in_output
            ),
        )

    def _tokens(self, batch: TokenBatch, ended: list[str]) -> list[tuple[str, msgspec.Struct]]:
        events: list[StreamEvent] = []
        stopped: list[str] = []
        time = batch.time
        get_stream = self._streams.get
        add_event = events.append
        if batch.prompt_logprobs or batch.embeddings:
            self._extras.add(batch)
        if (first := batch.first_scheduled) is not None:  # before outputs: they may end them
            for rid in first.request_ids:
                family = self._families.get(rid)  # a parent: every sample's, else its own
                for sample in family.open if family is not None else (rid,):
                    if (one := get_stream(sample)) is not None and one.scheduled_time is None:
                        one.scheduled_time = first.time
        for output in batch.outputs:
            stream = get_stream(output.request_id)
            if stream is None:
                family = self._families.get(output.request_id)
                if family is not None:  # an end for the whole request: each open sample's
                    reason, error = output.finish_reason, output.error
                    for sample in list(family.open):
                        end = SeqOutput(sample, (), reason, None, None, 0, error)
                        self._sample_event(get_stream(sample), end, time, events, ended)
                    continue
                if output.request_id in self._failed:
                    message = self._failed.pop(output.request_id)
                    self._end_failed(output, message, events, stopped, ended)
                continue  # already ended (a stop string won the race) or never opened
            try:
                event = self._output(stream, output, time)
            except Exception as exc:  # fail this request only; the others go on
                log.exception("cannot stream the request's output", request_id=output.request_id)
                del self._streams[output.request_id]
                message = f"the streamer failed on this request's output: {exc}"
                self._end_failed(output, message, events, stopped, ended)
                continue
            if event is None:
                continue
            if stream.family is not None:
                if self._sample_event(stream, output, time, events, ended, event):
                    stopped.append(output.request_id)
                continue
            add_event(event)
            if event.is_terminal:
                del self._streams[output.request_id]
                ended.append(output.request_id)
                # The scheduler only needs telling when it does not know the request ended.
                if isinstance(event, Finished) and output.finish_reason is None:
                    stopped.append(output.request_id)
        out: list[tuple[str, msgspec.Struct]] = []
        if stopped:
            out.append(("scheduler", StopRequests(request_ids=tuple(stopped))))
        out.append(("client", StreamBatch(events=tuple(events), stats=batch.stats)))
        return out

    def _sample_event(
        self,
        stream: _Stream | None,
        output: SeqOutput,
        time: float,
        events: list[StreamEvent],
        ended: list[str],
        event: StreamEvent | None = None,
    ) -> bool:
        """Pass one sample's event through its family; True if a stop string ended it (the
        scheduler still runs it)."""
        if stream is None or stream.family is None:
            return False
        if event is None:
            event = self._output(stream, output, time)
            if event is None:
                return False
        assert isinstance(event, Delta | Finished | Aborted | Failed)
        family = stream.family
        events.extend(family.on_event(output.request_id, stream.index, event))
        if isinstance(event, Delta):
            return False
        del self._streams[output.request_id]
        if not family.open:
            rid = stream.opened.request_id
            self._families.pop(rid, None)
            ended.append(rid)
        return isinstance(event, Finished) and output.finish_reason is None

    @staticmethod
    def _end_failed(
        output: SeqOutput, why: str, events: list[StreamEvent], stopped: list[str], ended: list[str]
    ) -> None:
        """A Failed event (`why`) for a request the streamer cannot serve; the scheduler frees it."""
        events.append(Failed(request_id=output.request_id, message=why))
        ended.append(output.request_id)
        if output.finish_reason is None:  # the scheduler still runs it
            stopped.append(output.request_id)

    def _output(self, stream: _Stream, output: SeqOutput, time: float) -> StreamEvent | None:
        """The event for one request's output (None: nothing to say yet)."""
        token_ids = output.token_ids
        if output.finish_reason is not None or not token_ids or stream.has_stops:
            return self._advance(stream, output, time)
        # The hot path: new tokens of a running request without stop strings (what _advance
        # does, minus the stop-string matcher and the end handling).
        push = stream.detokenizer.push
        num_tokens = len(token_ids)
        if num_tokens == 1:
            text = push(token_ids[0])
        else:
            text = "".join([push(token_id) for token_id in token_ids])
        stream.num_output_tokens += num_tokens
        prompt_tokens = prompt_logprobs = embedding = prompt_ids = None  # later tokens: none
        if stream.first_token_time is None:
            stream.first_token_time = time
            prompt_tokens = stream.opened.num_prompt_tokens
            prompt_logprobs, embedding, prompt_ids = self._extras.first_event(stream.opened)
        stream.last_token_time = time
        if output.num_cached_tokens > stream.num_cached_tokens:
            stream.num_cached_tokens = output.num_cached_tokens
        logprobs = output.logprobs
        return Delta(
            request_id=stream.opened.request_id,
            text=text,
            token_ids=token_ids,
            logprobs=None if logprobs is None else logprobs[:num_tokens],
            index=stream.index,
            prompt_tokens=prompt_tokens,
            prompt_logprobs=prompt_logprobs,
            embedding=embedding,
            prompt_token_ids=prompt_ids,
        )

    def _advance(self, stream: _Stream, output: SeqOutput, time: float) -> StreamEvent | None:
        """Feed one SeqOutput; the event it yields (None: nothing to say)."""
        texts: list[str] = []
        num_kept = 0
        # vLLM's min_tokens: stop strings are matched only in the text of later tokens
        params = stream.opened.params
        num_unmatched = params.min_tokens - stream.num_output_tokens
        # as vLLM's: the stop token that ended the answer (EOS, stop_token_ids) is not text
        unsaid = len(output.token_ids) - 1
        if output.stop_reason is None or params.include_stop_str_in_output:
            unsaid = -1
        for i, token_id in enumerate(output.token_ids):
            num_kept += 1
            text = "" if i == unsaid else stream.detokenizer.push(token_id)
            stops = stream.stops
            texts.append(stops.skip(text) if num_kept <= num_unmatched else stops.feed(text))
            if stream.stops.matched is not None:
                break  # tokens after the stop string are not part of the output
        token_ids = output.token_ids[:num_kept]
        logprobs = None if output.logprobs is None else output.logprobs[:num_kept]
        prompt_tokens = prompt_logprobs = embedding = prompt_ids = None
        if num_kept:
            stream.num_output_tokens += num_kept
            if stream.first_token_time is None:
                stream.first_token_time = time
                prompt_tokens = stream.opened.num_prompt_tokens
                prompt_logprobs, embedding, prompt_ids = self._extras.first_event(stream.opened)
            stream.last_token_time = time
        stream.num_cached_tokens = max(stream.num_cached_tokens, output.num_cached_tokens)

        rid = stream.opened.request_id
        reason = output.finish_reason
        if stream.stops.matched is None and reason is None:
            if not num_kept:
                return None
            return Delta(
                request_id=rid,
                text="".join(texts),
                token_ids=token_ids,
                logprobs=logprobs,
                index=stream.index,
                prompt_tokens=prompt_tokens,
                prompt_logprobs=prompt_logprobs,
                embedding=embedding,
                prompt_token_ids=prompt_ids,
            )
        texts.append(stream.final_text())
        text = "".join(texts)
        if stream.stops.matched is not None or reason in (FinishReason.STOP, FinishReason.LENGTH):
            matched, stop = stream.stops.matched, output.stop_reason
            if stop == self._tokenizer.eos_token_id and not params.ignore_eos:
                stop = None  # vLLM names no stop token at the model's EOS
            return Finished(
                request_id=rid,
                text=text,
                token_ids=token_ids,
                finish_reason=FinishReason.STOP if matched is not None or not reason else reason,
                stop_reason=matched if matched is not None else stop,
                usage=stream.usage(),
                timings=stream.timings(time),
                logprobs=logprobs,
                index=stream.index,
                params_n=stream.opened.params.n,
                params_max_tokens=stream.opened.params.max_tokens,
                prompt_logprobs=prompt_logprobs,
                embedding=embedding,
                prompt_token_ids=prompt_ids,
            )
        if reason == FinishReason.ABORT:
            return Aborted(
                request_id=rid,
                reason=output.error or "aborted",
                usage=stream.usage(),
                timings=stream.timings(time),
                text=text,
                token_ids=token_ids,
                index=stream.index,
            )
        return Failed(
            request_id=rid,
            message=output.error or "the engine failed",
            text=text,
            token_ids=token_ids,
            index=stream.index,
            cause=output.cause,
        )
