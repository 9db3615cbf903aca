"""A grammar that dead-ends after a free part (`[ab]\\x04`: SmolLM2's vocabulary has no token
starting with 0x04) is found where its mask is filled, before the model samples there, and its
request fails with a typed cause; the rows beside it go on. On the default model's tokenizer."""

from __future__ import annotations

import numpy as np
from troupe.actors.core.executor import _grammar_failures
from troupe.actors.core.grammar import GrammarCore
from troupe.gpu.token_bitmask import join_masks, mask_array
from troupe.messages import (
    ComputeMasks,
    FailedSeq,
    GrammarRow,
    GrammarTokens,
    SampledToken,
    SeqFailureReason,
    StepResult,
    StructuredOutputs,
)

DEAD = StructuredOutputs(regex="[ab]\\x04")
DIGITS = StructuredOutputs(regex="[0-9]{3}")
WHY = "next it allows only byte 0x04, and no token of this model's vocabulary writes what it allows"


def _one(tok, text: str) -> int:  # type: ignore[no-untyped-def]
    (token_id,) = tok.encode(text, add_special_tokens=False)
    return int(token_id)


def test_a_dead_end_fails_its_row_alone_before_sampling(tok, compiler) -> None:  # type: ignore[no-untyped-def]
    core = GrammarCore(compiler)
    first = core.masks(
        ComputeMasks(step_id=1, rows=(GrammarRow("dead", DEAD), GrammarRow("ok", DIGITS)))
    )
    assert first is not None and first.failed == () and first.dead_ends == ()
    a, seven = _one(tok, "a"), _one(tok, "7")
    ahead = core.ahead(GrammarTokens(step_id=1, request_ids=("dead", "ok"), token_ids=(a, seven)))
    assert ahead.request_ids == ("dead", "ok")
    assert ahead.failed == (("dead", WHY),) and ahead.dead_ends == ("dead",)
    bits = mask_array(ahead)
    assert not bits[0].any() and bits[1].any()  # the other row's mask is its grammar's
    assert "dead" not in core.matchers and "ok" in core.matchers
    # back from a preemption, it is still a dead end; released, it is forgotten
    again = core.masks(ComputeMasks(step_id=2, rows=(GrammarRow("dead"),)))
    assert again is not None and again.failed == (("dead", WHY),)
    assert again.dead_ends == ("dead",)
    # the executor gives it no token, with the cause and the why; the other keeps its own
    result = StepResult(
        step_id=2, time=1.0, sampled=(SampledToken("dead", 5), SampledToken("ok", seven))
    )
    joined = join_masks(first, ahead)  # a plan with fresh and ahead masks
    out = _grammar_failures(result, joined, ahead.dead_ends)
    assert out.sampled == (SampledToken("ok", seven),)
    assert out.failed == (FailedSeq("dead", SeqFailureReason.GRAMMAR_DEAD_END, WHY),)
    core.masks(ComputeMasks(step_id=3, released=("dead",)))
    assert core.masks(ComputeMasks(step_id=3, rows=(GrammarRow("dead", DIGITS),))).failed == ()  # type: ignore[union-attr]


def test_a_fresh_fill_finds_a_dead_end_too(tok, compiler) -> None:  # type: ignore[no-untyped-def]
    """A matcher whose mask is filled by ComputeMasks (not ahead) that allows nothing."""
    import xgrammar

    core = GrammarCore(compiler)
    matcher = xgrammar.GrammarMatcher(compiler.compile(StructuredOutputs(regex="[ab]\U0007d936")))
    assert matcher.accept_token(_one(tok, "b"))
    core.matchers["m"] = matcher
    masks = core.masks(ComputeMasks(step_id=1, rows=(GrammarRow("m"), GrammarRow("n", DIGITS))))
    assert masks is not None and masks.dead_ends == ("m",)
    ((rid, why),) = masks.failed
    assert rid == "m" and why.startswith("next it allows only byte 0xf1,")
    assert np.array_equal(mask_array(masks).any(axis=1), [False, True])
