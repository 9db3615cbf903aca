"""StreamerCore with the real SmolLM2 tokenizer: exact events, routing, usage and timings."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from troupe.actors.core.streamer import StreamerCore
from troupe.actors.core.tokenizer_files import load_tokenizer
from troupe.actors.core.tokenizer_text import TextTokenizer
from troupe.messages import (
    Aborted,
    Delta,
    EngineStats,
    Failed,
    Finished,
    FinishReason,
    FirstScheduled,
    PromptLogprobs,
    RejectCode,
    Rejected,
    RequestOpened,
    RequestRejected,
    RequestsEnded,
    SamplingParams,
    SeqOutput,
    StopRequests,
    StreamBatch,
    StreamEvent,
    Timings,
    TokenBatch,
    TokenLogprob,
    Usage,
)
from troupe.messages.samples import sample_id

HELLO, WORLD = 19556, 905  # "Hello", " world"
HI, EMOJI_HEAD, EMOJI_TAIL, BANG = 26843, 40303, 218, 17  # "Hi", " \xf0\x9f\x98", "\x80", "!"
ST, OP, HERE = 5022, 7627, 1535  # " ST", "OP", " here"
EOS = 2  # <|im_end|>


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_tokenizer()


def _open(rid: str, arrival: float = 100.0, **params: Any) -> RequestOpened:
    return RequestOpened(
        request_id=rid,
        params=SamplingParams(**params),
        num_prompt_tokens=7,
        prompt_tail_ids=(HELLO,),
        arrival_time=arrival,
    )


def _event(routed: tuple[str, msgspec.Struct]) -> StreamEvent:
    """The single event of a StreamBatch sent to the client."""
    box, batch = routed
    assert box == "client" and isinstance(batch, StreamBatch) and len(batch.events) == 1
    return batch.events[0]


def _events(out: list[tuple[str, msgspec.Struct]]) -> tuple[StreamEvent, ...]:
    """The events of the StreamBatch sent to the client."""
    [batch] = [b for box, b in out if box == "client"]
    assert isinstance(batch, StreamBatch)
    return batch.events


def _batch(
    step: int,
    time: float,
    *outputs: SeqOutput,
    stats: EngineStats | None = None,
    first_scheduled: FirstScheduled | None = None,
) -> TokenBatch:
    return TokenBatch(
        step_id=step, time=time, outputs=outputs, stats=stats, first_scheduled=first_scheduled
    )


def test_deltas_then_finished_with_usage_and_timings(tok: TextTokenizer) -> None:
    core = StreamerCore(tok)
    stats = EngineStats(num_running=1, num_steps=3)
    assert core.handle([_open("r")]) == []
    scheduled = FirstScheduled(100.25, ("r",))  # planned at 100.25, its first token at 100.5
    out = core.handle(
        [_batch(1, 100.5, SeqOutput("r", (HI,)), stats=stats, first_scheduled=scheduled)]
    )
    assert out == [
        (
            "client",
            StreamBatch(
                events=(Delta(request_id="r", text="Hi", token_ids=(HI,), prompt_tokens=7),),
                stats=stats,
            ),
        )
    ]
    out = core.handle([_batch(2, 100.75, SeqOutput("r", (EMOJI_HEAD,)))])
    assert out == [
        ("client", StreamBatch(events=(Delta(request_id="r", text=" ", token_ids=(EMOJI_HEAD,)),)))
    ]
    out = core.handle(
        [
            _batch(3, 101.0, SeqOutput("r", (EMOJI_TAIL,), num_cached_tokens=4)),
            _batch(4, 101.5, SeqOutput("r", (BANG, EOS), FinishReason.STOP, stop_reason=EOS)),
        ]
    )
    finished = Finished(
        request_id="r",
        text="!",
        token_ids=(BANG, EOS),
        finish_reason=FinishReason.STOP,
        stop_reason=None,  # the model's EOS: vLLM names no stop token
        usage=Usage(prompt_tokens=7, completion_tokens=5, cached_tokens=4),
        # 1.0 s over 4 more tokens; vLLM's phases: queued 0.25 s, prefill 0.25 s, decode 1.0 s
        timings=Timings(
            ttft=0.5, tpot=0.25, e2e=1.5, queue=0.25, prefill=0.25, decode=1.0, inference=1.25
        ),
        params_max_tokens=16,  # SamplingParams' default, echoed for vLLM's request_params_*
    )
    assert out == [
        (
            "client",
            StreamBatch(events=(Delta(request_id="r", text="😀", token_ids=(EMOJI_TAIL,)),)),
        ),
        ("client", StreamBatch(events=(finished,))),
        ("admission", RequestsEnded(request_ids=("r",))),
    ]
    assert core.num_live_requests == 0
    # Later outputs for an ended request are ignored, but the batch is still delivered.
    assert core.handle([_batch(5, 102.0, SeqOutput("r", (HELLO,)))]) == [
        ("client", StreamBatch(events=()))
    ]


@pytest.mark.parametrize(
    ("params", "token", "stop_reason"),
    [
        ({}, EOS, None),  # the model's EOS
        ({"stop_token_ids": (EOS,)}, EOS, None),  # vLLM checks EOS before stop_token_ids
        ({"stop_token_ids": (BANG,)}, BANG, BANG),
        ({"ignore_eos": True, "stop_token_ids": (EOS,)}, EOS, EOS),  # only as a stop token id
    ],
)
def test_stop_reason_names_stop_token_ids_but_not_the_eos(
    tok: TextTokenizer, params: dict[str, Any], token: int, stop_reason: int | None
) -> None:
    assert tok.eos_token_id == EOS
    core = StreamerCore(tok)
    core.handle([_open("r", **params)])
    stop = SeqOutput("r", (HELLO, token), FinishReason.STOP, stop_reason=token)
    event = _event(core.handle([_batch(1, 101.0, stop)])[0])
    assert isinstance(event, Finished)
    assert (event.finish_reason, event.stop_reason) == (FinishReason.STOP, stop_reason)


def test_stop_string_over_tokens_stops_the_scheduler(tok: TextTokenizer) -> None:
    core = StreamerCore(tok)
    core.handle([_open("a", stop=("STOP",)), _open("b")])
    out = core.handle([_batch(1, 101.0, SeqOutput("a", (HELLO, ST)), SeqOutput("b", (WORLD,)))])
    assert out == [
        (
            "client",
            StreamBatch(
                events=(
                    # "ST" held; first deltas carry the prompt's length
                    Delta(request_id="a", text="Hello ", token_ids=(HELLO, ST), prompt_tokens=7),
                    Delta(request_id="b", text=" world", token_ids=(WORLD,), prompt_tokens=7),
                )
            ),
        )
    ]
    out = core.handle([_batch(2, 102.0, SeqOutput("a", (OP, HERE)), SeqOutput("b", (HERE,)))])
    assert out[0] == ("scheduler", StopRequests(request_ids=("a",)))
    route, batch = out[1]
    assert route == "client" and isinstance(batch, StreamBatch)
    done, delta_b = batch.events
    assert done == Finished(
        request_id="a",
        text="",
        token_ids=(OP,),  # " here" came after the stop string: dropped
        finish_reason=FinishReason.STOP,
        stop_reason="STOP",
        usage=Usage(prompt_tokens=7, completion_tokens=3),
        timings=Timings(ttft=1.0, tpot=0.5, e2e=2.0, decode=1.0),  # never scheduled: no queue
        params_max_tokens=16,
    )
    assert delta_b == Delta(request_id="b", text=" here", token_ids=(HERE,))
    assert out[2] == ("admission", RequestsEnded(request_ids=("a",)))


def test_stop_string_included_and_false_start_flushed_at_length(tok: TextTokenizer) -> None:
    core = StreamerCore(tok)
    core.handle([_open("inc", stop=("STOP",), include_stop_str_in_output=True)])
    core.handle([_batch(1, 100.1, SeqOutput("inc", (ST,)))])
    out = core.handle([_batch(2, 100.2, SeqOutput("inc", (OP,)))])
    event = _event(out[1])
    assert isinstance(event, Finished) and event.text == "STOP" and event.stop_reason == "STOP"

    core.handle([_open("fs", stop=("STORM",))])
    core.handle([_batch(3, 100.3, SeqOutput("fs", (HELLO, ST)))])
    out = core.handle([_batch(4, 100.4, SeqOutput("fs", (), FinishReason.LENGTH))])
    assert out[0][0] == "client"  # LENGTH came from the scheduler: no StopRequests
    event = _event(out[0])
    assert isinstance(event, Finished)
    assert (event.text, event.finish_reason, event.stop_reason) == ("ST", FinishReason.LENGTH, None)
    assert event.usage.completion_tokens == 2 and event.token_ids == ()


def test_stop_string_in_a_finishing_output_needs_no_stop_request(tok: TextTokenizer) -> None:
    core = StreamerCore(tok)
    core.handle([_open("s", stop=(" world",))])
    out = core.handle([_batch(1, 101.0, SeqOutput("s", (HELLO, WORLD), FinishReason.LENGTH))])
    assert [box for box, _ in out] == ["client", "admission"]
    event = _event(out[0])
    assert (event.text, event.finish_reason, event.stop_reason) == (
        "Hello",
        FinishReason.STOP,
        " world",
    )


def test_abort_error_and_rejection_are_terminal(tok: TextTokenizer) -> None:
    core = StreamerCore(tok)
    core.handle([_open("ab", stop=("STOP",)), _open("er"), _open("late")])
    core.handle([_batch(1, 100.25, SeqOutput("ab", (HELLO, ST)))])
    out = core.handle(
        [
            _batch(
                2,
                100.75,
                SeqOutput("ab", (), FinishReason.ABORT, error="client went away"),
                SeqOutput("er", (), FinishReason.ERROR, error="CUDA out of memory"),
            ),
            RequestRejected(
                request_id="late",
                code=RejectCode.TOO_LONG,
                message="prompt too long",
                field="prompt",
            ),
            RequestRejected(request_id="never", code=RejectCode.INVALID_REQUEST, message="bad"),
        ]
    )
    assert out == [
        (
            "client",
            StreamBatch(
                events=(
                    Aborted(
                        request_id="ab",
                        reason="client went away",
                        usage=Usage(prompt_tokens=7, completion_tokens=2),
                        timings=Timings(ttft=0.25, tpot=0.0, e2e=0.75, decode=0.0),
                        text="ST",  # held-back false start is flushed
                    ),
                    Failed(request_id="er", message="CUDA out of memory"),
                )
            ),
        ),
        (
            "client",
            StreamBatch(
                events=(
                    Rejected(
                        request_id="late",
                        code=RejectCode.TOO_LONG,
                        message="prompt too long",
                        field="prompt",
                    ),
                )
            ),
        ),
        (
            "client",
            StreamBatch(
                events=(
                    Rejected(request_id="never", code=RejectCode.INVALID_REQUEST, message="bad"),
                )
            ),
        ),
        ("admission", RequestsEnded(request_ids=("ab", "er", "late", "never"))),
    ]
    assert core.num_live_requests == 0


def test_logprobs_and_special_tokens(tok: TextTokenizer) -> None:
    core = StreamerCore(tok)
    core.handle([_open("lp", skip_special_tokens=False, logprobs=1)])
    lps = (TokenLogprob(HELLO, -0.1, ((HELLO, -0.1),)), TokenLogprob(EOS, -0.3, ((EOS, -0.3),)))
    out = core.handle(
        [_batch(1, 100.125, SeqOutput("lp", (HELLO, EOS), FinishReason.STOP, EOS, lps))]
    )
    event = _event(out[0])
    assert isinstance(event, Finished)
    # the EOS that ended it is not text (vLLM's include_stop_str_in_output puts it back)
    assert event.text == "Hello" and event.logprobs == lps and event.token_ids == (HELLO, EOS)
    assert event.timings == Timings(ttft=0.125, tpot=0.0, e2e=0.125, decode=0.0)
    core.handle([_open("kept", skip_special_tokens=False, include_stop_str_in_output=True)])
    out = core.handle([_batch(1, 100.5, SeqOutput("kept", (HELLO, EOS), FinishReason.STOP, EOS))])
    assert _event(out[0]).text == "Hello<|im_end|>"


def test_finish_mid_character_flushes_a_replacement_char(tok: TextTokenizer) -> None:
    core = StreamerCore(tok)
    core.handle([_open("m")])
    out = core.handle([_batch(1, 100.1, SeqOutput("m", (HI, EMOJI_HEAD), FinishReason.LENGTH))])
    event = _event(out[0])
    assert event.text == "Hi \ufffd" == tok.decode([HI, EMOJI_HEAD])


def test_min_tokens_defers_stop_strings(tok: TextTokenizer) -> None:
    """vLLM's min_tokens: a stop string in the first min_tokens tokens' text is output as
    text; one in later tokens' text stops the request."""
    core = StreamerCore(tok)
    core.handle([_open("a", stop=("STOP",), min_tokens=3)])
    out = core.handle([_batch(1, 101.0, SeqOutput("a", (HELLO, ST, OP)))])
    assert _event(out[0]) == Delta(
        request_id="a", text="Hello STOP", token_ids=(HELLO, ST, OP), prompt_tokens=7
    )
    out = core.handle([_batch(2, 102.0, SeqOutput("a", (ST, OP, HERE)))])
    assert out[0] == ("scheduler", StopRequests(request_ids=("a",)))
    done = _event(out[1])
    assert isinstance(done, Finished) and done.stop_reason == "STOP"
    assert done.text == " " and done.token_ids == (ST, OP)  # ST is " ST"


def test_prompt_logprobs_gathered_once_each_for_the_first_event(tok: TextTokenizer) -> None:
    core = StreamerCore(tok)
    core.handle([_open("pl", prompt_logprobs=0), _open("other")])

    def entries(start: int, n: int) -> tuple[TokenLogprob, ...]:
        return tuple(TokenLogprob(100 + p, -p / 10) for p in range(start, start + n))

    chunks = (
        PromptLogprobs("pl", 1, entries(1, 3)),
        PromptLogprobs("pl", 1, entries(1, 2)),  # recomputed: nothing new
        PromptLogprobs("pl", 6, entries(6, 1)),  # past a gap: dropped (logged)
        PromptLogprobs("pl", 2, entries(2, 4)),  # overlaps: positions 4 and 5 are new
    )
    core.handle([TokenBatch(step_id=1, time=100.0, outputs=(), prompt_logprobs=chunks)])
    out = core.handle([_batch(2, 100.1, SeqOutput("pl", (HELLO,)), SeqOutput("other", (HI,)))])
    _, batch = out[-1]
    assert isinstance(batch, StreamBatch)
    first, other = batch.events
    assert isinstance(first, Delta) and first.prompt_logprobs == entries(1, 5)
    assert isinstance(other, Delta) and other.prompt_logprobs is None
    out = core.handle([_batch(3, 100.2, SeqOutput("pl", (WORLD,), FinishReason.LENGTH))])
    last = _event(out[0])
    assert isinstance(last, Finished) and last.prompt_logprobs is None
    assert not len(core._extras)  # gone with the request


def test_prompt_token_ids_lead_each_samples_first_event(tok: TextTokenizer) -> None:
    """SamplingParams.return_prompt_token_ids: the RequestOpened's ids on each sample's first
    event (a Delta, or a Finished that is also the first), never on later ones."""
    core = StreamerCore(tok)
    prompt = (HELLO, WORLD, HI)
    asked = _open("p", n=2, return_prompt_token_ids=True)
    core.handle([msgspec.structs.replace(asked, prompt_token_ids=prompt), _open("q")])
    a, b = sample_id("p", 0), sample_id("p", 1)
    out = core.handle([_batch(1, 100.1, SeqOutput(a, (HI,)), SeqOutput("q", (HI,)))])
    first, other = _events(out)
    assert isinstance(first, Delta) and first.prompt_token_ids == prompt
    assert isinstance(other, Delta) and other.prompt_token_ids is None
    out = core.handle(
        [_batch(2, 100.2, SeqOutput(a, (BANG,)), SeqOutput(b, (BANG,), FinishReason.LENGTH))]
    )
    later, b_first = _events(out)
    assert isinstance(later, Delta) and later.prompt_token_ids is None
    assert isinstance(b_first, Finished) and b_first.prompt_token_ids == prompt


def test_prompt_logprobs_on_a_first_event_that_finishes(tok: TextTokenizer) -> None:
    core = StreamerCore(tok)
    core.handle([_open("one", prompt_logprobs=1)])
    scored = (TokenLogprob(HELLO, -0.5, ((WORLD, -0.2),)),)
    batch = TokenBatch(
        step_id=1,
        time=100.5,
        outputs=(SeqOutput("one", (WORLD,), FinishReason.LENGTH),),
        prompt_logprobs=(PromptLogprobs("one", 1, scored),),
    )
    event = _event(core.handle([batch])[0])
    assert isinstance(event, Finished) and event.prompt_logprobs == scored
