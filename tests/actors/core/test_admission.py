"""Admission core: exact routing, limits named in rejections, accounting of ends."""

from __future__ import annotations

from troupe.actors.core.admission import AdmissionCore
from troupe.messages import (
    AbortRequest,
    AdmittedRequest,
    RejectCode,
    RequestRejected,
    RequestsEnded,
    SamplingParams,
    TokenizedRequest,
)


def core(**kw: int) -> AdmissionCore:
    args = {
        "max_model_len": 100,
        "vocab_size": 1000,
        "max_num_seqs": 2,
        "max_queued_requests": 1,
        "max_queued_tokens": 50,
    }
    args.update(kw)
    return AdmissionCore(**args)


def req(rid: str, n: int = 5, **params: object) -> TokenizedRequest:
    return TokenizedRequest(
        request_id=rid,
        prompt_token_ids=tuple(range(1, n + 1)),
        params=SamplingParams(**params),  # type: ignore[arg-type]
        arrival_time=1.0,
    )


def test_admits_with_length_cap_and_forwards_aborts_in_order() -> None:
    c = core()
    out = c.handle([req("a", 10, max_tokens=500), AbortRequest(request_id="a")])
    assert out[0][0] == "scheduler"
    admitted = out[0][1]
    assert isinstance(admitted, AdmittedRequest)
    assert admitted.max_total_tokens == 100  # capped by max_model_len
    assert out[1] == ("scheduler", AbortRequest(request_id="a"))
    assert c.num_in_flight == 1


def test_rejections_name_field_and_limit() -> None:
    c = core()
    cases = [
        (req("t", 100), "prompt", RejectCode.TOO_LONG, "max_model_len is 100"),
        (req("m", max_tokens=0), "max_tokens", RejectCode.INVALID_REQUEST, ">= 1"),
        (req("p", top_p=0.0), "top_p", RejectCode.INVALID_REQUEST, "(0, 1]"),
        (req("s", stop_token_ids=(1000,)), "stop_token_ids", RejectCode.INVALID_REQUEST, "1000"),
        (req("l", logprobs=21), "logprobs", RejectCode.INVALID_REQUEST, "[0, 20]"),
        (req("q", prompt_logprobs=-1), "prompt_logprobs", RejectCode.INVALID_REQUEST, "[0, 20]"),
        (req("e", 0), "prompt", RejectCode.INVALID_REQUEST, "empty"),
    ]
    for msg, field, code, text in cases:
        [(dest, out)] = c.handle([msg])
        assert dest == "streamer"
        assert isinstance(out, RequestRejected)
        assert (out.field, out.code) == (field, code)
        assert text in out.message
    assert c.num_in_flight == 0


def test_a_strict_max_tokens_must_fit_where_a_plain_one_is_clipped() -> None:
    c = core()
    fits, over, clipped = (
        req("f", 10, max_tokens=90, strict_max_tokens=True),
        req("o", 10, max_tokens=91, strict_max_tokens=True),
        req("c", 10, max_tokens=91),
    )
    out = c.handle([fits, over, clipped])
    assert [dest for dest, _ in out] == ["scheduler", "streamer", "scheduler"]
    rejected = out[1][1]
    assert isinstance(rejected, RequestRejected)
    assert (rejected.field, rejected.code) == ("max_tokens", RejectCode.TOO_LONG)
    assert "(10 tokens) + max_tokens (91)" in rejected.message
    assert "max_model_len = 100" in rejected.message
    admitted = [m for _, m in out if isinstance(m, AdmittedRequest)]
    assert [m.max_total_tokens for m in admitted] == [100, 100]


def test_prompt_logprobs_refused_where_not_served() -> None:
    c = AdmissionCore(
        max_model_len=100,
        vocab_size=1000,
        max_num_seqs=2,
        max_queued_requests=1,
        max_queued_tokens=50,
        no_hidden_outputs="disaggregation computes prompts elsewhere",
    )
    [(dest, out)] = c.handle([req("q", prompt_logprobs=0)])
    assert dest == "streamer" and isinstance(out, RequestRejected)
    assert out.field == "prompt_logprobs" and "disaggregation" in out.message
    [(dest, _)] = c.handle([req("plain")])
    assert dest == "scheduler"


def test_overload_by_count_and_by_tokens_then_recovers() -> None:
    c = core()
    assert [d for d, _ in c.handle([req("a"), req("b"), req("c")])] == ["scheduler"] * 3
    [(_, over)] = c.handle([req("d")])
    assert isinstance(over, RequestRejected) and over.code == RejectCode.OVERLOADED
    assert "max_num_seqs + max_queued_requests = 3" in over.message
    c.handle([RequestsEnded(request_ids=("a", "b", "c", "unknown"))])
    assert c.num_in_flight == 0
    [(_, big)] = c.handle([req("big", 60)])
    assert isinstance(big, RequestRejected) and "max_queued_tokens = 50" in big.message


def test_duplicate_live_request_id_is_rejected() -> None:
    c = core()
    c.handle([req("a")])
    [(_, dup)] = c.handle([req("a")])
    assert isinstance(dup, RequestRejected) and dup.field == "request_id"
