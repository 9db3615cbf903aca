"""The grammar actor's core, the scheduler's GrammarFeed and the executor meeting plan and masks,
with exact expectations on the default model's tokenizer (no model)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import structlog
from troupe.actors.core.executor import ExecutorCore, _grammar_failures
from troupe.actors.core.grammar import GrammarCore
from troupe.actors.core.grammar_compiler import GrammarError
from troupe.actors.core.grammar_feed import GrammarFeed
from troupe.actors.core.request_state import Request
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.token_bitmask import allowed_ids, mask_array
from troupe.messages import (
    AdmittedRequest,
    ComputeMasks,
    FailedSeq,
    GrammarRow,
    GrammarTokens,
    SampledToken,
    SamplingParams,
    SeqFailureReason,
    SeqWork,
    StepPlan,
    StepResult,
    StructuredOutputs,
    TokenMasks,
)

from tests.actors.core.conftest import VOCAB

REGEX = StructuredOutputs(regex="[0-9]{2}")


def allowed_texts(tok, masks: TokenMasks, row: int) -> set[str]:  # type: ignore[no-untyped-def]
    ids = allowed_ids(mask_array(masks)[row], VOCAB)
    return {tok.token_bytes(int(i)).decode("utf-8", "replace") for i in ids}


def _tokens(step_id: int, **tokens: int) -> GrammarTokens:
    return GrammarTokens(
        step_id=step_id, request_ids=tuple(tokens), token_ids=tuple(tokens.values())
    )


def test_masks_follow_the_grammar_and_advance(tok, compiler) -> None:  # type: ignore[no-untyped-def]
    core = GrammarCore(compiler)
    first = core.masks(ComputeMasks(step_id=1, rows=(GrammarRow("a", REGEX),)))
    assert first is not None and first.request_ids == ("a",) and first.failed == ()
    texts = allowed_texts(tok, first, 0)
    assert texts and all(re.fullmatch("[0-9]{1,2}", t) for t in texts), texts
    (seven,) = tok.encode("7", add_special_tokens=False)
    second = core.ahead(_tokens(1, a=seven))
    assert second.ahead and second.step_id == 1 and second.request_ids == ("a",)
    assert allowed_texts(tok, second, 0) == {str(d) for d in range(10)}
    again = core.masks(ComputeMasks(step_id=2, rows=(GrammarRow("a"),)))  # back: same mask
    assert again is not None and again.bitmask == second.bitmask
    done = core.ahead(_tokens(2, a=seven))
    assert set(allowed_ids(mask_array(done)[0], VOCAB).tolist()) == set(tok.eos_token_ids)
    ended = core.ahead(_tokens(3, a=tok.eos_token_ids[0]))
    assert ended.failed == (("a", "sampled past the end of its grammar"),)
    assert not mask_array(ended).any()  # nothing more may follow


def test_refused_token_and_missing_spec_fail_the_request_alone(tok, compiler) -> None:  # type: ignore[no-untyped-def]
    core = GrammarCore(compiler)
    core.masks(ComputeMasks(step_id=1, rows=(GrammarRow("a", REGEX), GrammarRow("b", REGEX))))
    (letter,) = tok.encode("x", add_special_tokens=False)
    (one,) = tok.encode("1", add_special_tokens=False)
    ahead = core.ahead(_tokens(1, a=letter, b=one))
    assert ahead.request_ids == ("b", "a") and [rid for rid, _ in ahead.failed] == ["a"]
    assert "refused token" in ahead.failed[0][1]
    masks = core.masks(ComputeMasks(step_id=2, rows=(GrammarRow("a"), GrammarRow("c"))))
    assert masks is not None
    assert [rid for rid, _ in masks.failed] == ["a", "c"]
    assert "refused token" in masks.failed[0][1] and "no grammar spec" in masks.failed[1][1]
    assert "b" in core.matchers and "a" not in core.matchers
    assert core.ahead(_tokens(2, a=one)).failed == ahead.failed  # still broken, until released


def test_release_drops_matchers_and_no_rows_sends_nothing(compiler) -> None:  # type: ignore[no-untyped-def]
    core = GrammarCore(compiler)
    core.masks(ComputeMasks(step_id=1, rows=(GrammarRow("a", REGEX),)))
    assert core.handle([ComputeMasks(step_id=2, released=("a",))]) == []
    assert core.matchers == {}


def test_compiler_names_the_field_and_caches(compiler) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(GrammarError) as info:
        compiler.compile(StructuredOutputs(regex="(ab"))
    assert info.value.field == "structured_outputs.regex"
    spec = StructuredOutputs.from_schema(
        {"type": "object", "properties": {"n": {"type": "integer"}}}
    )
    assert compiler.compile(spec) is compiler.compile(spec)


def _request(rid: str, outputs: list[int], spec: StructuredOutputs | None) -> Request:
    msg = AdmittedRequest(
        request_id=rid,
        prompt_token_ids=(5, 6, 7),
        params=SamplingParams(structured_outputs=spec),
        arrival_time=0.0,
        max_total_tokens=64,
    )
    req = Request.admit(msg, 0, frozenset({2}))
    req.token_ids.extend(outputs)
    return req


def test_feed_covers_last_steps_rows_ahead_and_sends_the_spec_first() -> None:
    feed = GrammarFeed()
    assert feed.feed(StepPlan(step_id=1, seqs=()), [(_request("a", [], REGEX), 3, True)])[1] is None
    feed.active = True  # the scheduler sets it when a constrained request arrives
    a, b, free = _request("a", [], REGEX), _request("b", [], REGEX), _request("f", [], None)
    sent, msg = feed.feed(
        StepPlan(step_id=1, seqs=()), [(a, 3, True), (b, 2, False), (free, 3, True)]
    )
    assert sent.awaits_masks and sent.ahead_masks_of is None and msg is not None
    assert msg.rows == (GrammarRow("a", REGEX),)  # b does not sample; f is free text
    # a sampled in step 1: its mask comes ahead; b's first row carries its spec
    sent, msg = feed.feed(StepPlan(step_id=2, seqs=()), [(a, 1, True), (b, 3, True)])
    assert sent.awaits_masks and sent.ahead_masks_of == 1
    assert msg is not None and msg.rows == (GrammarRow("b", REGEX),)
    sent, msg = feed.feed(StepPlan(step_id=3, seqs=()), [(a, 1, True), (b, 1, True)])
    assert not sent.awaits_masks and sent.ahead_masks_of == 2 and msg is None  # all ahead
    sent, msg = feed.feed(StepPlan(step_id=4, seqs=(), released=("a", "f")), [(free, 4, True)])
    assert not sent.is_masked and msg == ComputeMasks(step_id=4, released=("a",))
    # b skipped step 4 (preempted): its mask is filled on its row, without the spec again
    sent, msg = feed.feed(StepPlan(step_id=5, seqs=()), [(b, 1, True)])
    assert sent.awaits_masks and sent.ahead_masks_of is None
    assert msg is not None and msg.rows == (GrammarRow("b"),)
    sent, msg = feed.feed(StepPlan(step_id=6, seqs=()), [(free, 5, True)])
    assert msg is None and sent == StepPlan(step_id=6, seqs=())


def _plan(step_id: int, rid: str, params: SamplingParams | None) -> StepPlan:
    work = SeqWork(
        request_id=rid, token_ids=(5, 6, 7), start_pos=0, block_ids=(0,), reset=True, params=params
    )
    return StepPlan(step_id=step_id, seqs=(work,), awaits_masks=True)


def _only(token: int, rids: tuple[str, ...], **kw: object) -> TokenMasks:
    words = (VOCAB + 31) // 32
    bitmask = np.zeros((len(rids), words), dtype=np.int32)
    bitmask[:, token // 32] = 1 << (token % 32)
    return TokenMasks(request_ids=rids, num_words=words, bitmask=bitmask.tobytes(), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("masks_first", [False, True])
def test_executor_meets_plan_and_masks_in_either_order(masks_first: bool) -> None:
    masks = _only(1000, ("a",), step_id=1)
    plan = _plan(1, "a", SamplingParams(structured_outputs=REGEX))
    core = ExecutorCore(FakeRunner(block_size=4, num_gpu_blocks=4, num_cpu_blocks=0))
    order = [masks, plan] if masks_first else [plan, masks]
    assert core.handle([order[0]]) == []
    (to_grammar, (dest, result)) = core.handle([order[1]])
    assert dest == "scheduler" and [s.token_id for s in result.sampled] == [1000]
    # the grammar hears the masked step's tokens first, to fill the next masks ahead
    assert to_grammar == (
        "grammar",
        GrammarTokens(step_id=1, request_ids=("a",), token_ids=(1000,)),
    )
    ((dest, _),) = core.handle([StepPlan(step_id=2, seqs=())])  # unmasked: nothing to the grammar
    assert dest == "scheduler"


@pytest.mark.parametrize(
    "order", ["plan, ahead, fresh", "fresh, plan, ahead", "ahead, fresh, plan"]
)
def test_executor_waits_for_the_masks_ahead_and_the_fresh_ones(order: str) -> None:
    """A plan whose row "a" takes the masks filled ahead after step 1 and whose row "b" waits
    for fresh ones samples once both are in; masks ahead of another step do not count."""
    constrained = SamplingParams(structured_outputs=REGEX)
    works = tuple(
        SeqWork(request_id=r, token_ids=(5,), start_pos=0, block_ids=(i,), reset=True, params=constrained)
        for i, r in enumerate("ab")
    )  # fmt: skip
    plan = StepPlan(step_id=2, seqs=works, awaits_masks=True, ahead_masks_of=1)
    msgs = {
        "plan": plan,
        "ahead": _only(1001, ("a", "gone"), step_id=1, ahead=True),
        "fresh": _only(1002, ("b",), step_id=2),
    }
    core = ExecutorCore(FakeRunner(block_size=4, num_gpu_blocks=4, num_cpu_blocks=0))
    assert core.handle([_only(1003, ("a",), step_id=0, ahead=True)]) == []  # stale: ignored
    *early, last = order.split(", ")
    for name in early:
        assert core.handle([msgs[name]]) == []
    (to_grammar, (_, result)) = core.handle([msgs[last]])
    assert {(s.request_id, s.token_id) for s in result.sampled} == {("a", 1001), ("b", 1002)}
    assert set(zip(to_grammar[1].request_ids, to_grammar[1].token_ids, strict=True)) == {
        ("a", 1001),
        ("b", 1002),
    }


def test_executor_fails_the_requests_whose_grammar_failed() -> None:
    words = (VOCAB + 31) // 32
    masks = TokenMasks(
        step_id=1,
        request_ids=("a",),
        num_words=words,
        bitmask=np.full((1, words), -1, np.int32).tobytes(),
        failed=(("a", "its grammar refused token 9"),),
    )
    core = ExecutorCore(FakeRunner(block_size=4, num_gpu_blocks=4, num_cpu_blocks=0))
    core.handle([_plan(1, "a", SamplingParams(structured_outputs=REGEX))])
    ((_, result),) = core.handle([masks])  # no token sampled: nothing for the grammar
    assert result.sampled == () and [f.reason for f in result.failed] == [SeqFailureReason.GRAMMAR]


JSON = StructuredOutputs.from_schema(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }
)


def test_masks_ahead_follow_each_walk(tok, compiler) -> None:  # type: ignore[no-untyped-def]
    """Two requests walk their grammars on allowed tokens, hearing each token only through
    GrammarTokens: every ahead mask equals a fresh matcher's after the same tokens, and asking
    again on a row (a request back from a preemption) gives the same mask."""
    import xgrammar

    core = GrammarCore(compiler)
    specs = {"a": JSON, "b": REGEX}
    walks: dict[str, list[int]] = {rid: [] for rid in specs}
    masks = core.masks(
        ComputeMasks(step_id=1, rows=tuple(GrammarRow(r, s) for r, s in specs.items()))
    )
    rng = np.random.default_rng(0)
    for step in range(1, 14):
        assert masks is not None
        picked = {}
        for i, rid in enumerate(masks.request_ids):
            allowed = allowed_ids(mask_array(masks)[i], VOCAB)
            if rid not in dict(masks.failed):
                going = [t for t in allowed if t not in tok.eos_token_ids]  # EOS when only it
                picked[rid] = int(rng.choice(going or allowed))
        if not picked:
            break
        for rid, token in picked.items():
            walks[rid].append(token)
        masks = core.ahead(_tokens(step, **picked))
        for i, rid in enumerate(masks.request_ids):
            fresh = xgrammar.GrammarMatcher(compiler.compile(specs[rid]))
            assert all(fresh.accept_token(t) for t in walks[rid])
            want = xgrammar.allocate_token_bitmask(1, VOCAB).numpy()
            if not fresh.is_terminated():
                fresh.fill_next_token_bitmask(want)
                assert (mask_array(masks)[i] == want[0]).all(), (rid, step)
        if step % 3 == 0:
            again = core.masks(
                ComputeMasks(step_id=step + 1, rows=tuple(GrammarRow(r) for r in masks.request_ids))
            )
            assert again is not None and again.bitmask == masks.bitmask
    assert step > 5


def test_an_ended_grammar_fails_only_a_request_that_samples_on() -> None:
    """The masks after a stop token name the request as ended; a request that finished there
    is not in the step, so nothing fails and nothing is logged (every structured request used
    to log 'structured output failed' at its end). One that did sample on fails, logged."""
    masks = TokenMasks(
        step_id=4,
        request_ids=("a", "b"),
        num_words=1,
        bitmask=bytes(8),
        failed=(("a", "sampled past the end of its grammar"),),
        ahead=True,
    )
    result = StepResult(step_id=4, time=1.0, sampled=(SampledToken("b", 7),))
    with structlog.testing.capture_logs() as logs:
        assert _grammar_failures(result, masks) == result
    assert not [e for e in logs if e["event"] == "structured output failed"], logs
    on = StepResult(step_id=4, time=1.0, sampled=(SampledToken("a", 3), SampledToken("b", 7)))
    with structlog.testing.capture_logs() as logs:
        out = _grammar_failures(on, masks)
    assert out.sampled == (SampledToken("b", 7),)
    assert out.failed == (FailedSeq("a", SeqFailureReason.GRAMMAR),)
    assert [e["request_id"] for e in logs if e["event"] == "structured output failed"] == ["a"]
