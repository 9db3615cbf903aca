"""A request that makes a core raise fails alone: a Failed terminal event, its share of the
limits and its blocks released, and the core keeps serving the others."""

from __future__ import annotations

import pytest
from troupe.actors.core.admission import AdmissionCore
from troupe.actors.core.streamer import StreamerCore
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.messages import (
    AdmittedRequest,
    Delta,
    Failed,
    FinishReason,
    RequestFailed,
    RequestOpened,
    RequestsEnded,
    SamplingParams,
    SeqOutput,
    StopRequests,
    StreamBatch,
    TokenBatch,
    TokenizedRequest,
)

HELLO = 19556


@pytest.fixture(scope="module")
def streamer() -> StreamerCore:
    return StreamerCore(load_tokenizer())


def _opened(rid: str, params: SamplingParams) -> RequestOpened:
    return RequestOpened(
        request_id=rid, params=params, num_prompt_tokens=3, prompt_tail_ids=(), arrival_time=1.0
    )


def _batch(*outputs: SeqOutput) -> TokenBatch:
    return TokenBatch(step_id=1, time=2.0, outputs=outputs)


def _token(rid: str, token_id: int, reason: FinishReason | None = None) -> SeqOutput:
    return SeqOutput(rid, (token_id,), reason, None, None, 0)


def _malformed(rid: str, reason: FinishReason | None = None) -> SeqOutput:
    """An output whose logprobs are not a tuple: streaming it raises TypeError."""
    return SeqOutput(rid, (HELLO,), reason, None, 5, 0)  # type: ignore[arg-type]


def test_a_stream_that_cannot_open_fails_at_its_first_output(streamer: StreamerCore) -> None:
    # An empty stop string bypassed the client edge's check (a core driven directly).
    out = streamer.handle(
        [
            _opened("bad", SamplingParams(stop=("",))),
            _opened("good", SamplingParams()),
        ]
    )
    assert out == []
    out = streamer.handle([_batch(_token("bad", HELLO), _token("good", HELLO))])
    assert out[0] == ("scheduler", StopRequests(request_ids=("bad",)))  # free its blocks
    box, batch = out[1]
    assert box == "client" and isinstance(batch, StreamBatch)
    failed, delta = batch.events
    assert isinstance(failed, Failed) and failed.request_id == "bad"
    assert "could not open" in failed.message
    assert isinstance(delta, Delta) and (delta.request_id, delta.text) == ("good", "Hello")
    assert out[2] == ("admission", RequestsEnded(request_ids=("bad",)))
    # Later outputs for the failed request are ignored; the good one goes on.
    out = streamer.handle(
        [_batch(_token("bad", HELLO), _token("good", HELLO, FinishReason.LENGTH))]
    )
    (box, batch), ended = out
    assert [e.request_id for e in batch.events] == ["good"]
    assert ended == ("admission", RequestsEnded(request_ids=("good",)))
    assert streamer.num_live_requests == 0


def test_an_output_that_breaks_the_streamer_fails_only_its_request(
    streamer: StreamerCore,
) -> None:
    streamer.handle([_opened("odd", SamplingParams()), _opened("fine", SamplingParams())])
    out = streamer.handle([_batch(_malformed("odd"), _token("fine", HELLO))])
    assert out[0] == ("scheduler", StopRequests(request_ids=("odd",)))
    failed, delta = out[1][1].events  # type: ignore[attr-defined]
    assert isinstance(failed, Failed) and "streamer failed" in failed.message
    assert isinstance(delta, Delta) and delta.request_id == "fine"
    # A terminal output that fails needs no StopRequests: the scheduler already ended it.
    out = streamer.handle([_batch(_malformed("fine", FinishReason.LENGTH))])
    assert [box for box, _ in out] == ["client", "admission"]
    assert streamer.num_live_requests == 0


def test_admission_fails_one_request_and_keeps_its_limits_whole() -> None:
    core = AdmissionCore(
        max_model_len=100,
        vocab_size=1000,
        max_num_seqs=1,
        max_queued_requests=0,
        max_queued_tokens=50,
    )

    # A check() that raises what it never should (check() itself turns malformed fields
    # into ParamError, so the fault is injected).
    class _Broken(SamplingParams):
        def check(self, *, max_logprobs: int = 20, vocab_size: int | None = None) -> None:
            raise TypeError("boom")

    broken = _Broken()
    bad = TokenizedRequest(
        request_id="bad", prompt_token_ids=(1, 2), params=broken, arrival_time=1.0
    )
    good = TokenizedRequest(
        request_id="good", prompt_token_ids=(1, 2), params=SamplingParams(), arrival_time=1.0
    )
    (box, failed), (box2, admitted) = core.handle([bad, good])
    assert box == "streamer" and isinstance(failed, RequestFailed)
    assert failed.request_id == "bad" and "admission failed" in failed.message
    # The failed request took no seat: the one seat (max_num_seqs=1) went to "good".
    assert box2 == "scheduler" and isinstance(admitted, AdmittedRequest)
    assert core.num_in_flight == 1


def test_streamer_turns_request_failed_into_one_failed_event(streamer: StreamerCore) -> None:
    streamer.handle([_opened("r", SamplingParams())])
    out = streamer.handle([RequestFailed(request_id="r", message="tokenizer broke")])
    (box, batch), ended = out
    assert box == "client"
    assert batch.events == (Failed(request_id="r", message="tokenizer broke"),)  # type: ignore[attr-defined]
    assert ended == ("admission", RequestsEnded(request_ids=("r",)))
    assert streamer.num_live_requests == 0
