"""Varied small JSON schemas: the structured-output workload of tests and benchmarks.

`make_schemas(n)` returns n distinct schemas cycling through shapes a client sends: flat
objects with required fields, nested objects, bounded arrays, enums, bounded numbers, strings
with patterns, anyOf. Each one differs from the others (field names, bounds, enum values),
so each compiles to its own grammar; strings are bounded so a small model can finish them.
"""

from __future__ import annotations

from typing import Any

_WORDS = ("name", "city", "color", "animal", "tool", "fruit", "planet", "river", "metal", "tree")
_ENUMS = (
    ("red", "green", "blue"),
    ("cat", "dog", "bird", "fish"),
    ("small", "medium", "large"),
    ("yes", "no"),
    ("north", "south", "east", "west"),
)


def _word(i: int) -> dict[str, Any]:
    return {"type": "string", "pattern": f"^[a-z]{{1,{4 + i % 5}}}$"}


def _shape(i: int) -> dict[str, Any]:
    key = _WORDS[i % len(_WORDS)]
    other = _WORDS[(i * 3 + 1) % len(_WORDS)]
    if other == key:
        other = f"{other}2"
    low, high = i % 7, 10 + (i * 13) % 90
    match i % 7:
        case 0:  # flat, required, bounded integer
            return {
                "type": "object",
                "properties": {
                    key: _word(i),
                    "count": {"type": "integer", "minimum": low, "maximum": high},
                },
                "required": [key, "count"],
            }
        case 1:  # enum and boolean
            return {
                "type": "object",
                "properties": {
                    "kind": {"enum": list(_ENUMS[i % len(_ENUMS)])},
                    "ok": {"type": "boolean"},
                },
                "required": ["kind", "ok"],
            }
        case 2:  # nested object
            return {
                "type": "object",
                "properties": {
                    key: {
                        "type": "object",
                        "properties": {
                            other: _word(i),
                            "level": {"type": "integer", "minimum": 0, "maximum": high},
                        },
                        "required": [other, "level"],
                    }
                },
                "required": [key],
            }
        case 3:  # bounded array of bounded integers
            return {
                "type": "object",
                "properties": {
                    f"{key}s": {
                        "type": "array",
                        "items": {"type": "integer", "minimum": low, "maximum": high},
                        "minItems": 1,
                        "maxItems": 2 + i % 3,
                    }
                },
                "required": [f"{key}s"],
            }
        case 4:  # anyOf: a number or a short word
            return {
                "type": "object",
                "properties": {
                    key: {"anyOf": [{"type": "integer", "minimum": 0, "maximum": high}, _word(i)]}
                },
                "required": [key],
            }
        case 5:  # bounded number and an optional field
            return {
                "type": "object",
                "properties": {
                    "score": {"type": "number", "minimum": -high, "maximum": high},
                    key: _word(i),
                },
                "required": ["score"],
            }
        case _:  # array of small objects with an enum
            return {
                "type": "object",
                "properties": {
                    "items": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"size": {"enum": list(_ENUMS[2])}},
                            "required": ["size"],
                        },
                        "maxItems": 2,
                    }
                },
                "required": ["items"],
            }


def make_schemas(n: int) -> list[dict[str, Any]]:
    """n distinct schemas (see the module docstring); the i-th is the same in every call."""
    out = []
    for i in range(n):
        schema = _shape(i)
        schema["title"] = f"schema{i}"  # distinct even when a shape and its bounds repeat
        out.append(schema)
    return out
