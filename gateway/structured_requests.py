"""The request fields that ask for structured output -> one StructuredOutputs, or a named 400.

OpenAI's `response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema":
{"name", "schema", "strict"}}, and vLLM's {"type": "structural_tag", "format"} or its older
{"type": "structural_tag", "structures", "triggers"}) on both endpoints, and vLLM's extras:
`structured_outputs` ({"json" | "regex" | "choice" | "grammar" | "json_object" |
"structural_tag"}), `guided_json`, `guided_regex`,
`guided_choice`, `guided_grammar`. At most one of them may ask for a constraint. The engine
names a spec that does not compile `structured_outputs.<kind>`; `client_fields` maps that back
to the field this client wrote.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
from troupe.gateway.errors import invalid
from troupe.messages import StructuredOutputs


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class JsonSchemaFormat(_Body, kw_only=True):
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = msgspec.field(default=None, name="schema")
    # strict or not, the output follows the schema: troupe always constrains it fully
    strict: bool | None = None


class ResponseFormat(_Body, kw_only=True):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # structural_tag (vLLM's): xgrammar's `format`, or the older `structures` and `triggers`
    format: dict[str, Any] | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


class StructuredOutputsBody(_Body, kw_only=True):
    """vLLM's `structured_outputs` object (the fields troupe serves)."""

    json: dict[str, Any] | bool | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None  # its JSON text, as vLLM's


class StructuredFields(_Body, kw_only=True):
    """Mixed into the request bodies (and read from websocket frames)."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsBody | None = None
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


STRUCTURED_KEYS = tuple(StructuredFields.__struct_fields__)


def structured_outputs(body: StructuredFields) -> tuple[StructuredOutputs | None, dict[str, str]]:
    """The constraint the body asks for (None: free text) and, for renaming the engine's
    field names in errors, {engine field: client field}."""
    found: list[tuple[str, StructuredOutputs]] = []
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(("response_format", StructuredOutputs(json_object=True)))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise invalid(
                "response_format.json_schema.schema",
                'response_format {"type": "json_schema"} needs json_schema.schema',
            )
        spec = StructuredOutputs.from_schema(fmt.json_schema.json_schema)
        found.append(("response_format.json_schema.schema", spec))
    elif fmt is not None and fmt.type == "structural_tag":
        found.append(("response_format", _structural_tag(fmt)))
    if (so := body.structured_outputs) is not None:
        found += _vllm(so)
    if body.guided_json is not None:
        found.append(("guided_json", _schema(body.guided_json, "guided_json")))
    if body.guided_regex is not None:
        found.append(("guided_regex", StructuredOutputs(regex=body.guided_regex)))
    if body.guided_choice is not None:
        found.append(("guided_choice", StructuredOutputs(choice=tuple(body.guided_choice))))
    if body.guided_grammar is not None:
        found.append(("guided_grammar", StructuredOutputs(grammar=body.guided_grammar)))
    if not found:
        return None, {}
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise invalid(found[1][0], f"ask for one structured output at most, got {names}")
    return checked_spec(*found[0])


def checked_spec(field: str, spec: StructuredOutputs) -> tuple[StructuredOutputs, dict[str, str]]:
    """`spec`, asked for by the client's `field`, if it holds together (else a 400 naming the
    field), and the renames of the engine's fields to that one."""
    broken = spec.check()
    if broken is not None:
        raise invalid(field, f"invalid '{field}': {broken[1]}")
    return spec, {f"structured_outputs.{spec.kind}": field, "structured_outputs": field}


def _vllm(so: StructuredOutputsBody) -> list[tuple[str, StructuredOutputs]]:
    out = []
    if so.json is not None:
        out.append(("structured_outputs.json", _schema(so.json, "structured_outputs.json")))
    if so.regex is not None:
        out.append(("structured_outputs.regex", StructuredOutputs(regex=so.regex)))
    if so.choice is not None:
        out.append(("structured_outputs.choice", StructuredOutputs(choice=tuple(so.choice))))
    if so.grammar is not None:
        out.append(("structured_outputs.grammar", StructuredOutputs(grammar=so.grammar)))
    if so.json_object:
        out.append(("structured_outputs.json_object", StructuredOutputs(json_object=True)))
    if so.structural_tag is not None:
        spec = StructuredOutputs(structural_tag=so.structural_tag)
        out.append(("structured_outputs.structural_tag", spec))
    return out


def _structural_tag(fmt: ResponseFormat) -> StructuredOutputs:
    """response_format {"type": "structural_tag", ...} as one spec: xgrammar's `format`, or
    vLLM's older `structures` (each {"begin", "schema", "end"}) and `triggers`."""
    tag: dict[str, Any] = {"type": "structural_tag"}
    if fmt.format is not None:
        tag["format"] = fmt.format
    elif fmt.structures is not None and fmt.triggers is not None:
        tag |= {"structures": fmt.structures, "triggers": fmt.triggers}
    else:
        raise invalid(
            "response_format",
            'response_format {"type": "structural_tag"} needs format, or structures and triggers',
        )
    return StructuredOutputs(structural_tag=json.dumps(tag, ensure_ascii=False))


def _schema(schema: dict[str, Any] | bool | str, field: str) -> StructuredOutputs:
    """A schema given as an object or as its JSON text (vLLM accepts both)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise invalid(field, f"'{field}' is not a JSON schema: {exc}") from None
    if not isinstance(schema, dict | bool):
        raise invalid(field, f"'{field}' must be a JSON schema object")
    return StructuredOutputs.from_schema(schema)
