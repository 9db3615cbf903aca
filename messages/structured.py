"""Structured output: what a request's text must match (a JSON schema, a regex, a choice, an
EBNF grammar, a structural tag), as one SamplingParams field. vLLM's StructuredOutputsParams,
by name.

Exactly one kind is set. A JSON schema travels as its JSON text (key order kept: it is the order
the fields are generated in), so the struct stays frozen and hashable: the grammar cache is
keyed by the struct itself.

`reasoning` lets a reasoning model think before the constraint starts (vLLM applies the
grammar only after the reasoning ends; troupe writes that into the grammar itself):

    none      the constraint holds from the first token
    required  the text starts inside a thinking block (deepseek_r1, or a prompt that left
              `<think>` open): any text up to the first `</think>`, then the constrained part
    optional  the text may open with a whole `<think>...</think>` block, then the constrained
              part, or be the constrained part alone (qwen3, thinking left to the model)
    harmony   GPT-OSS's messages: any number of analysis messages, then the final channel's
              body is the constrained part (`<|channel|>analysis<|message|>...<|end|><|start|>
              assistant<|channel|>final<|message|>` then the constraint)

The tags are `<think>` and `</think>`, the ones troupe's tag reasoning parsers read; harmony's
markers (HARMONY_*) are special tokens, which a grammar names by id (actors/core/spec_grammar.py).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

Reasoning = Literal["none", "required", "optional", "harmony"]
REASONING_MODES: tuple[Reasoning, ...] = ("none", "required", "optional", "harmony")
THINK_START, THINK_END = "<think>", "</think>"
HARMONY_START, HARMONY_CHANNEL = "<|start|>", "<|channel|>"
HARMONY_CONSTRAIN, HARMONY_MESSAGE = "<|constrain|>", "<|message|>"
HARMONY_END, HARMONY_RETURN, HARMONY_CALL = "<|end|>", "<|return|>", "<|call|>"
HARMONY_ENDS = (HARMONY_END, HARMONY_RETURN, HARMONY_CALL)  # a message's body ends at one
HARMONY_MARKERS = (
    HARMONY_START,
    HARMONY_CHANNEL,
    HARMONY_CONSTRAIN,
    HARMONY_MESSAGE,
    *HARMONY_ENDS,
)
MAX_SPEC_CHARS = 64 * 1024  # a schema, regex or grammar longer than this is refused
MAX_CHOICES = 256
_TEXT_KINDS = ("json", "regex", "choice", "grammar", "structural_tag")  # json_object: a flag


class StructuredOutputs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One constraint on the generated text. `json`: a JSON schema (its JSON text);
    `json_object`: any JSON object; `regex`; `choice`: one of these strings exactly;
    `grammar`: EBNF in xgrammar's (GBNF-like) syntax, root rule `root`; `structural_tag`: the
    JSON text of an xgrammar structural tag (`{"type": "structural_tag", "format": ...}`), or
    vLLM's older `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`: free text
    until a trigger, then the tag it starts (actors/core/spec_grammar.py). `reasoning`:
    whether a `<think>...</think>` block (or harmony's analysis messages) comes before the
    constrained part (see the module's doc)."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: str | None = None
    reasoning: Reasoning = "none"

    @classmethod
    def from_schema(cls, schema: Any) -> StructuredOutputs:
        """From a decoded JSON schema (a dict) or its JSON text."""
        text = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
        return cls(json=text)

    @property
    def kind(self) -> str:
        """The field that is set (for error messages: `structured_outputs.<kind>`)."""
        for name in _TEXT_KINDS:
            if getattr(self, name) is not None:
                return name
        return "json_object"

    def check(self) -> tuple[str, str] | None:
        """(field, message) for the first broken limit; None when well formed. Whether the
        schema, regex or grammar compiles is the grammar compiler's to say."""
        if self.reasoning not in REASONING_MODES:
            modes = ", ".join(REASONING_MODES)
            return "reasoning", f"reasoning is one of {modes}, got {self.reasoning!r}"
        given = [n for n in _TEXT_KINDS if getattr(self, n) is not None]
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            found = ", ".join(given) or "none"
            kinds = "json, json_object, regex, choice, grammar, structural_tag"
            return "", f"exactly one of {kinds} (got {found})"
        name = given[0]
        if name == "choice":
            assert self.choice is not None
            if not self.choice or len(self.choice) > MAX_CHOICES:
                return name, f"choice needs 1 to {MAX_CHOICES} strings, got {len(self.choice)}"
            if not all(self.choice):
                return name, "choice strings must be non-empty"
            size = sum(len(c) for c in self.choice)
        elif name == "json_object":
            size = 0
        else:
            size = len(getattr(self, name))
            if size == 0:
                return name, f"{name} must not be empty"
        if size > MAX_SPEC_CHARS:
            return name, f"{name} is {size} characters; at most {MAX_SPEC_CHARS}"
        return None
