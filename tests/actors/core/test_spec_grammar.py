"""Grammars that let a reasoning model think first (StructuredOutputs.reasoning), on the default
model's tokenizer: texts' token ids through a matcher of the compiled grammar, with exact
expectations on what is complete, what is only a prefix and what is refused."""

from __future__ import annotations

import msgspec
import pytest
import xgrammar
from troupe.messages import StructuredOutputs

SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


def _verdict(tok, compiler, spec: StructuredOutputs, text: str) -> str:  # type: ignore[no-untyped-def]
    """Verdict "complete": the text, then EOS; "prefix": the text but no EOS yet; or "refused"."""
    matcher = xgrammar.GrammarMatcher(compiler.compile(spec))
    for token_id in tok.encode(text, False):
        if not matcher.accept_token(token_id):
            return "refused"
    return "complete" if matcher.accept_token(tok.eos_token_ids[0]) else "prefix"


JSON = '{"a": 1}'
CASES = [
    # (text, required, optional, none)
    ("Let me think... a is 1.</think>" + JSON, "complete", "refused", "refused"),
    ("<think>Let me think.</think>" + JSON, "complete", "complete", "refused"),
    (JSON, "prefix", "complete", "complete"),  # required: still thinking
    ("Hm.</think>" + JSON + " and more", "refused", "refused", "refused"),
    ("<think>Hm.</think>" + JSON + "\n", "refused", "refused", "refused"),
    # the first `</think>` ends the thinking: a second one is not JSON
    ("<think>One.</think>Two.</think>" + JSON, "refused", "refused", "refused"),
    ("Thinking, never done", "prefix", "refused", "refused"),
    ('<think>Hm.</think>{"a": "x"}', "refused", "refused", "refused"),  # the schema holds
]


@pytest.mark.parametrize(("text", "required", "optional", "none"), CASES)
def test_json_after_thinking(tok, compiler, text, required, optional, none) -> None:  # type: ignore[no-untyped-def]
    got = tuple(
        _verdict(tok, compiler, StructuredOutputs(json=SCHEMA, reasoning=mode), text)
        for mode in ("required", "optional", "none")
    )
    assert got == (required, optional, none)


@pytest.mark.parametrize(
    ("spec", "answer", "wrong"),
    [
        (StructuredOutputs(json_object=True), '{"b": [true]}', "[1]"),
        (StructuredOutputs(regex="[0-9]{3}"), "123", "12a"),
        (StructuredOutputs(choice=("yes", "no")), "no", "maybe"),
        (StructuredOutputs(grammar='root ::= "x" [0-9]+'), "x42", "y42"),
    ],
)
def test_every_kind_follows_the_thinking(tok, compiler, spec, answer, wrong) -> None:  # type: ignore[no-untyped-def]
    required = msgspec.structs.replace(spec, reasoning="required")
    optional = msgspec.structs.replace(spec, reasoning="optional")
    thought = "Which one? </think>"
    assert _verdict(tok, compiler, required, thought + answer) == "complete"
    assert _verdict(tok, compiler, required, thought + wrong) == "refused"
    assert _verdict(tok, compiler, optional, "<think>" + thought + answer) == "complete"
    assert _verdict(tok, compiler, optional, answer) == "complete"
    assert _verdict(tok, compiler, optional, wrong) == "refused"
    assert _verdict(tok, compiler, spec, thought + answer) == "refused"


def test_a_bad_reasoning_mode_is_named() -> None:
    spec = StructuredOutputs(json_object=True, reasoning="sometimes")  # type: ignore[arg-type]
    assert spec.check() == (
        "reasoning",
        "reasoning is one of none, required, optional, harmony, got 'sometimes'",
    )
