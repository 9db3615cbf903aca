"""The grammar actor's core, the scheduler's GrammarFeed and the executor meeting plan and masks,
with exact expectations on the default model's tokenizer (no model)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from troupe.actors.core.executor import ExecutorCore
from troupe.actors.core.grammar import GrammarCore
from troupe.actors.core.grammar_compiler import GrammarError, grammar_compiler_for
from troupe.actors.core.grammar_feed import GrammarFeed
from troupe.actors.core.request_state import Request
from troupe.actors.graph import load_tokenizer_for
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.token_bitmask import allowed_ids, mask_array
from troupe.messages import (
    AdmittedRequest,
    ComputeMasks,
    GrammarRow,
    GrammarTokens,
    SamplingParams,
    SeqFailureReason,
    SeqWork,
    StepPlan,
    StructuredOutputs,
    TokenMasks,
)

VOCAB = 49152
REGEX = StructuredOutputs(regex="[0-9]{2}")


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    return load_tokenizer_for(None)


@pytest.fixture(scope="module")
def compiler(tok):  # type: ignore[no-untyped-def]
    return grammar_compiler_for(tok, VOCAB, tok.eos_token_ids, 30.0)


def allowed_texts(tok, masks: TokenMasks, row: int) -> set[str]:  # type: ignore[no-untyped-def]
    ids = allowed_ids(mask_array(masks)[row], VOCAB)
    return {tok.token_bytes(int(i)).decode("utf-8", "replace") for i in ids}


def test_masks_follow_the_grammar_and_advance(tok, compiler) -> None:  # type: ignore[no-untyped-def]
    core = GrammarCore(compiler)
    first = core.masks(ComputeMasks(step_id=1, rows=(GrammarRow("a", (), REGEX),)))
    assert first is not None and first.request_ids == ("a",) and first.failed == ()
    texts = allowed_texts(tok, first, 0)
    assert texts and all(re.fullmatch("[0-9]{1,2}", t) for t in texts), texts
    seven = tok.encode("7", add_special_tokens=False)
    second = core.masks(ComputeMasks(step_id=2, rows=(GrammarRow("a", tuple(seven)),)))
    assert second is not None
    assert allowed_texts(tok, second, 0) == {str(d) for d in range(10)}
    done = core.masks(ComputeMasks(step_id=3, rows=(GrammarRow("a", tuple(seven)),)))
    assert done is not None
    assert set(allowed_ids(mask_array(done)[0], VOCAB).tolist()) == set(tok.eos_token_ids)


def test_refused_token_and_missing_spec_fail_the_request_alone(tok, compiler) -> None:  # type: ignore[no-untyped-def]
    core = GrammarCore(compiler)
    core.masks(
        ComputeMasks(step_id=1, rows=(GrammarRow("a", (), REGEX), GrammarRow("b", (), REGEX)))
    )
    letter = tuple(tok.encode("x", add_special_tokens=False))
    masks = core.masks(
        ComputeMasks(
            step_id=2,
            rows=(GrammarRow("a", letter), GrammarRow("b", ()), GrammarRow("c", ())),
        )
    )
    assert masks is not None
    assert [rid for rid, _ in masks.failed] == ["a", "c"]
    assert "refused token" in masks.failed[0][1] and "no grammar spec" in masks.failed[1][1]
    assert "b" in core.matchers and "a" not in core.matchers


def test_release_drops_matchers_and_no_rows_sends_nothing(compiler) -> None:  # type: ignore[no-untyped-def]
    core = GrammarCore(compiler)
    core.masks(ComputeMasks(step_id=1, rows=(GrammarRow("a", (), REGEX),)))
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


def test_feed_sends_new_tokens_once_and_the_spec_first() -> None:
    feed = GrammarFeed()
    a, b, free = _request("a", [], REGEX), _request("b", [], REGEX), _request("f", [], None)
    plan = StepPlan(step_id=1, seqs=())
    sent, msg = feed.feed(plan, [(a, 3, True), (b, 2, False), (free, 3, True)])
    assert sent.awaits_masks and msg is not None
    assert msg.rows == (GrammarRow("a", (), REGEX),)  # b does not sample; f is free text
    a.token_ids.extend([40, 41])
    b.token_ids.extend([])
    sent, msg = feed.feed(StepPlan(step_id=2, seqs=()), [(a, 5, True), (b, 3, True)])
    assert msg is not None and msg.rows == (GrammarRow("a", (40, 41)), GrammarRow("b", (), REGEX))
    sent, msg = feed.feed(StepPlan(step_id=3, seqs=(), released=("a", "f")), [(free, 4, True)])
    assert not sent.awaits_masks and msg == ComputeMasks(step_id=3, released=("a",))
    sent, msg = feed.feed(StepPlan(step_id=4, seqs=()), [(free, 5, True)])
    assert msg is None and sent == StepPlan(step_id=4, seqs=())


def _plan(step_id: int, rid: str, params: SamplingParams | None) -> StepPlan:
    work = SeqWork(
        request_id=rid, token_ids=(5, 6, 7), start_pos=0, block_ids=(0,), reset=True, params=params
    )
    return StepPlan(step_id=step_id, seqs=(work,), awaits_masks=True)


@pytest.mark.parametrize("masks_first", [False, True])
def test_executor_meets_plan_and_masks_in_either_order(masks_first: bool) -> None:
    words = (VOCAB + 31) // 32
    bitmask = np.zeros((1, words), dtype=np.int32)
    bitmask[0, 1000 // 32] = 1 << (1000 % 32)  # only token 1000
    masks = TokenMasks(step_id=1, request_ids=("a",), num_words=words, bitmask=bitmask.tobytes())
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


def test_masks_ahead_equal_masks_computed_on_the_row(tok, compiler) -> None:  # type: ignore[no-untyped-def]
    """Two requests walk their grammars on allowed tokens. One core hears each step's tokens
    from the executor first (GrammarTokens) and fills ahead; the other sees only the rows. The
    masks are identical every step, and the ahead fill served the rows that had no other news."""
    ahead, plain = GrammarCore(compiler), GrammarCore(compiler)
    rng = np.random.default_rng(0)
    rows = (GrammarRow("a", (), JSON), GrammarRow("b", (), REGEX))
    for step in range(1, 12):
        msg = ComputeMasks(step_id=step, rows=rows)
        got, want = ahead.masks(msg), plain.masks(msg)
        assert got is not None and want is not None
        assert got.bitmask == want.bitmask and got.failed == want.failed
        picked = []
        for i, row in enumerate(rows):
            allowed = allowed_ids(mask_array(want)[i], VOCAB)
            if len(allowed):  # prefer going on: EOS only when nothing else is allowed
                going = [t for t in allowed if t not in tok.eos_token_ids]
                picked.append((row.request_id, int(rng.choice(going or allowed))))
        if not picked:
            break
        ahead.handle([GrammarTokens(step_id=step, request_ids=tuple(r for r, _ in picked),
                                    token_ids=tuple(t for _, t in picked))])  # fmt: skip
        rows = tuple(GrammarRow(rid, (t,)) for rid, t in picked)
    assert ahead.num_ahead_hits >= 4 and plain.num_ahead_hits == 0


def test_rows_with_more_news_than_the_ahead_fill_are_filled_again(tok, compiler) -> None:  # type: ignore[no-untyped-def]
    """A row that carries tokens past the ones accepted ahead (a request that skipped a step)
    is advanced by the rest and filled on the spot; tokens that are not the ones accepted
    ahead fail the request alone; a release forgets what was pending."""
    core = GrammarCore(compiler)
    core.masks(
        ComputeMasks(step_id=1, rows=(GrammarRow("a", (), REGEX), GrammarRow("b", (), REGEX)))
    )
    one, two = (tuple(tok.encode(d, add_special_tokens=False)) for d in "12")
    core.handle([GrammarTokens(step_id=1, request_ids=("a", "b"), token_ids=(one[0], one[0]))])
    masks = core.masks(
        ComputeMasks(step_id=2, rows=(GrammarRow("a", one + two), GrammarRow("b", two)))
    )
    assert masks is not None and core.num_ahead_hits == 0
    allowed = set(allowed_ids(mask_array(masks)[0], VOCAB).tolist())
    assert allowed == set(tok.eos_token_ids)  # "12": the regex is complete, only EOS
    assert [rid for rid, _ in masks.failed] == ["b"] and "ahead" in masks.failed[0][1]
    core.handle([GrammarTokens(step_id=2, request_ids=("a",), token_ids=(two[0],))])
    core.masks(ComputeMasks(step_id=3, released=("a",)))
    assert core.matchers == {} and core._pending == {}
    core.masks(ComputeMasks(step_id=4, rows=(GrammarRow("c", (), REGEX),)))
    letter = tok.encode("x", add_special_tokens=False)[0]
    core.handle([GrammarTokens(step_id=4, request_ids=("c",), token_ids=(letter,))])
    masks = core.masks(ComputeMasks(step_id=5, rows=(GrammarRow("c", (letter,)),)))
    assert masks is not None and "refused token" in dict(masks.failed)["c"]
