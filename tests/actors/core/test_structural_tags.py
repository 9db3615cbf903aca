"""Structural tags (vLLM's `structural_tag` structured output) compiled for the default model's
vocabulary: xgrammar's own format as given, vLLM's older `structures` + `triggers` rewritten as
triggered tags (free text until a trigger, then the structure's JSON schema up to its end), and
malformed tags refused naming `structured_outputs.structural_tag`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from troupe.actors.core.grammar_compiler import GrammarError
from troupe.actors.core.spec_grammar import structural_tag_json
from troupe.messages import StructuredOutputs

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
LEGACY = {
    "type": "structural_tag",
    "structures": [{"begin": "<function=get_weather>", "schema": CITY, "end": "</function>"}],
    "triggers": ["<function="],
}
ANSWER = {  # xgrammar's format: the whole reply is one tag
    "type": "structural_tag",
    "format": {
        "type": "tag",
        "begin": "<answer>",
        "content": {"type": "json_schema", "json_schema": CITY},
        "end": "</answer>",
    },
}


def _accepts(tok, compiler, tag: dict[str, Any], text: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether the tag's grammar lets the model write `text` and then end."""
    import xgrammar

    compiled = compiler.compile(StructuredOutputs(structural_tag=json.dumps(tag)))
    matcher = xgrammar.GrammarMatcher(compiled)
    for token in tok.encode(text, add_special_tokens=False):
        if not matcher.accept_token(token):
            return False
    return bool(matcher.accept_token(tok.eos_token_id))


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("Sure.", True),  # no trigger: free text
        ('Let me look. <function=get_weather>{"city": "Paris"}</function> Done.', True),
        ('<function=get_weather>{"town": "Paris"}</function>', False),  # the schema holds
        ('<function=get_time>{"city": "Paris"}</function>', False),  # no such structure
    ],
)
def test_vllms_older_form_constrains_what_follows_a_trigger(  # type: ignore[no-untyped-def]
    tok, compiler, text: str, accepted: bool
) -> None:
    assert _accepts(tok, compiler, LEGACY, text) is accepted


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ('<answer>{"city": "Oslo"}</answer>', True),
        ('{"city": "Oslo"}', False),
        ("<answer>Oslo</answer>", False),
    ],
)
def test_xgrammars_format_is_taken_as_given(  # type: ignore[no-untyped-def]
    tok, compiler, text: str, accepted: bool
) -> None:
    assert _accepts(tok, compiler, ANSWER, text) is accepted
    assert structural_tag_json(json.dumps(ANSWER)) == json.dumps(ANSWER)


@pytest.mark.parametrize(
    "tag",
    [
        "{not json",
        json.dumps({"type": "structural_tag", "structures": "x", "triggers": []}),
        json.dumps({"type": "structural_tag", "structures": [{"begin": "<a>"}], "triggers": []}),
        json.dumps({"type": "structural_tag", "format": {"type": "nonsense"}}),
    ],
)
def test_malformed_tags_are_refused_by_name(compiler, tag: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(GrammarError) as info:
        compiler.compile(StructuredOutputs(structural_tag=tag))
    assert info.value.field == "structured_outputs.structural_tag"


def test_one_kind_at_most() -> None:
    broken = StructuredOutputs(regex="a", structural_tag=json.dumps(ANSWER)).check()
    assert broken is not None and "structural_tag" in broken[1]
    assert StructuredOutputs(structural_tag="").check() == (
        "structural_tag",
        "structural_tag must not be empty",
    )
