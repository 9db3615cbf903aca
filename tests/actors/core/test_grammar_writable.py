"""Specs the vocabulary cannot write are refused when they compile (found by the route fuzzer:
a guided_choice of U+7D936 got a mask that allowed no token, the model sampled one the grammar
refused, and the request failed mid-stream with a 500). On the default model's tokenizer, which
has no token starting with 0x04 or 0xf1, and on a toy vocabulary with exact expectations."""

from __future__ import annotations

import pytest
from troupe.actors.core.grammar_compiler import GrammarError
from troupe.actors.core.grammar_writable import TokenBytes, choice_error
from troupe.messages import StructuredOutputs


def test_writable_prefix_cuts_into_tokens() -> None:
    tokens = TokenBytes([b"", b"ab", b"c", b"abc", b"d"])
    assert tokens.writable_prefix(b"abcd") == 4
    assert tokens.writable_prefix(b"abab") == 4
    assert tokens.writable_prefix(b"abx") == 2  # stuck at byte 2
    assert tokens.writable_prefix(b"a") == 0  # "a" alone is no token
    assert tokens.writable_prefix(b"") == 0
    assert choice_error(["ab", "cd"], tokens) is None
    assert choice_error(["ab", "cax"], tokens) == (
        "choice[1] cannot be written with this model's vocabulary: no token continues it at "
        "byte 1 (0x61)"
    )


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (StructuredOutputs(choice=("\U0007d936",)), "choice[0] cannot be written"),
        (StructuredOutputs(choice=("ok", "a\x04b")), "choice[1] cannot be written"),
        (StructuredOutputs(regex="\\x04"), "no token of this model's vocabulary can begin"),
        (StructuredOutputs(grammar='root ::= "\\x04" "a"'), "can begin"),
        (StructuredOutputs(json='{"const": 4}', reasoning="none"), None),
        (StructuredOutputs(choice=("é", "日本", "a\nb")), None),
        (StructuredOutputs(regex="[a-z]+\\x04?"), None),  # the model may leave it out
    ],
)
def test_unwritable_specs_are_refused_by_name(compiler, spec, needle) -> None:  # type: ignore[no-untyped-def]
    if needle is None:
        assert compiler.compile(spec) is not None
        return
    with pytest.raises(GrammarError) as info:
        compiler.compile(spec)
    assert info.value.field == f"structured_outputs.{spec.kind}"
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        (StructuredOutputs(regex="a\\x04"), True),  # a literal past its first byte
        (StructuredOutputs(json='{"const": "\U0007d936"}'), True),  # '"' first, then 0xf1
        (StructuredOutputs(grammar='root ::= "a" "\\x04"'), True),
        (StructuredOutputs(json='{"const": "x\\u0004"}'), False),  # JSON escapes it: ASCII
        (StructuredOutputs(regex="ab[cd]e"), False),
    ],
)
def test_a_forced_literal_the_vocabulary_cannot_write_is_refused(  # type: ignore[no-untyped-def]
    compiler, spec, refused
) -> None:
    if not refused:
        assert compiler.compile(spec) is not None
        return
    with pytest.raises(GrammarError, match="which no token of this model's vocabulary holds"):
        compiler.compile(spec)
