"""A StructuredOutputs spec -> the xgrammar Grammar its text must match (not yet compiled).

The kinds map one to one onto xgrammar's builders (a choice is an EBNF alternation of its
strings; vLLM's older structural-tag form, `structures` and `triggers`, is rewritten as
xgrammar's `triggered_tags` format, each structure a tag whose content is its JSON schema). A spec with `reasoning` puts a thinking block in front of the constraint, in the
grammar itself, so the constraint starts where the reasoning parser's `content` starts:

    required  any text up to the first `</think>`, then the constraint
    optional  `<think>` any text `</think>` then the constraint  |  the constraint alone

"Any text" is xgrammar's structural-tag `any_text` (a TagDispatch that allows everything but
the end tag), so the first `</think>` ends the thinking and nothing may come between it and
the constrained part: the content is exactly what the constraint allows.

    harmony   any number of `<|channel|>analysis<|message|>` (any tokens but a marker)
              `<|end|><|start|>assistant`, then `<|channel|>final<|message|>` and the
              constraint

Harmony's markers are special tokens. In the grammar's vocabulary a special token's bytes are
its text behind SPECIAL (grammar_compiler.grammar_vocab), never valid UTF-8, so no text rule
writes one; the harmony rule names each marker by id (`special_ids`, the compiler's map from
their text), as xgrammar's token formats do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from troupe.messages.structured import (
    HARMONY_CHANNEL,
    HARMONY_END,
    HARMONY_MARKERS,
    HARMONY_MESSAGE,
    HARMONY_START,
    THINK_END,
    THINK_START,
    StructuredOutputs,
)

if TYPE_CHECKING:
    import xgrammar

SPECIAL = b"\xff"  # a special token's text follows, in the grammar's vocabulary


def spec_grammar(spec: StructuredOutputs, special_ids: Mapping[str, int]) -> xgrammar.Grammar:
    """The grammar of `spec` (raises ValueError or RuntimeError, xgrammar's, when it is bad);
    `special_ids`: the vocabulary's special tokens, by text."""
    import xgrammar

    grammar = _constraint(spec)
    if spec.reasoning == "harmony":
        return xgrammar.Grammar.concat(_harmony_head(special_ids), grammar)
    if spec.reasoning == "required":
        return xgrammar.Grammar.concat(_thinking(""), grammar)
    if spec.reasoning == "optional":
        return xgrammar.Grammar.union(
            xgrammar.Grammar.concat(_thinking(THINK_START), grammar), grammar
        )
    return grammar


def _constraint(spec: StructuredOutputs) -> xgrammar.Grammar:
    from xgrammar import Grammar

    if spec.json is not None:
        try:
            schema = json.loads(spec.json)
        except ValueError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise ValueError("a JSON schema is an object (or true/false)")
        return Grammar.from_json_schema(spec.json, any_whitespace=False)
    if spec.json_object:
        return Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
    if spec.regex is not None:
        return Grammar.from_regex(spec.regex)
    if spec.choice is not None:
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
        return Grammar.from_ebnf(f"root ::= {alternatives}")
    if spec.structural_tag is not None:
        return Grammar.from_structural_tag(structural_tag_json(spec.structural_tag))
    assert spec.grammar is not None, "StructuredOutputs.check ensures one kind is set"
    return Grammar.from_ebnf(spec.grammar)


def structural_tag_json(text: str) -> str:
    """A structural tag's JSON text as xgrammar reads it: as given, or vLLM's older form
    (`structures` and `triggers`) rewritten as a `triggered_tags` format."""
    try:
        tag = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(tag, dict) or "structures" not in tag:
        return text
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        raise ValueError("structures and triggers are lists")
    tags = []
    for i, item in enumerate(structures):
        if not isinstance(item, dict) or not {"begin", "end"} <= item.keys():
            raise ValueError(f"structures[{i}] needs begin, schema and end")
        content = {"type": "json_schema", "json_schema": item.get("schema", {})}
        tags.append({"type": "tag", "begin": item["begin"], "content": content, "end": item["end"]})
    fmt = {"type": "triggered_tags", "triggers": triggers, "tags": tags}
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


def _thinking(begin: str) -> xgrammar.Grammar:
    """`begin`, any text without `</think>`, then `</think>`."""
    from xgrammar import Grammar

    tag = {"type": "tag", "begin": begin, "content": {"type": "any_text"}, "end": THINK_END}
    return Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": tag}))


def _harmony_head(special_ids: Mapping[str, int]) -> xgrammar.Grammar:
    """Harmony's analysis messages, then the final channel's header (the module's doc)."""
    from xgrammar import Grammar

    missing = [m for m in HARMONY_MARKERS if m not in special_ids]
    if missing:
        raise ValueError(
            "reasoning harmony needs harmony's markers as special tokens, and this model's "
            f"vocabulary has no {', '.join(missing)}"
        )

    def token(marker: str) -> dict[str, Any]:
        return {"type": "token", "token": special_ids[marker]}

    def text(value: str) -> dict[str, Any]:
        return {"type": "const_string", "value": value}

    body = {"type": "any_tokens", "exclude_tokens": [special_ids[m] for m in HARMONY_MARKERS]}
    analysis = [token(HARMONY_CHANNEL), text("analysis"), token(HARMONY_MESSAGE), body]
    analysis += [token(HARMONY_END), token(HARMONY_START), text("assistant")]
    final = [token(HARMONY_CHANNEL), text("final"), token(HARMONY_MESSAGE)]
    thinking = {"type": "star", "content": {"type": "sequence", "elements": analysis}}
    head = {"type": "sequence", "elements": [thinking, *final]}
    return Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": head}))
