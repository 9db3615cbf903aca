"""SamplingParams.check: types, float32-safe floats, bounded ints, each error naming its field."""

from __future__ import annotations

from typing import Any

import pytest
from troupe.messages import ParamError, SamplingParams


@pytest.mark.parametrize(
    ("params", "field", "text"),
    [
        ({"temperature": "hot"}, "temperature", "float"),  # built directly: not type-checked
        ({"max_tokens": True}, "max_tokens", "bool"),
        ({"top_k": 1.5}, "top_k", "int"),
        ({"stop": ("a", 3)}, "stop", "str"),
        ({"temperature": 1e308}, "temperature", "[1e-30, 1e+30]"),
        ({"temperature": 1e-31}, "temperature", "0 (greedy) or in"),
        ({"temperature": -0.5}, "temperature", "[1e-30, 1e+30]"),
        ({"top_p": 1e-300}, "top_p", "float32"),
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"min_p": 1e-40}, "min_p", "float32"),
        ({"presence_penalty": 1e-35}, "presence_penalty", "float32"),
        ({"repetition_penalty": 1e31}, "repetition_penalty", "1e+30"),
        ({"max_tokens": 2**31}, "max_tokens", "<= 2147483647"),
        ({"top_k": 10**30}, "top_k", "<= 2147483647"),
        ({"top_k": -2}, "top_k", "-1, 0 (off) or >= 1"),
        ({"priority": 2**31}, "priority", "<= 2147483647"),
        ({"priority": -(2**31)}, "priority", ">= -2147483647"),
        ({"seed": 2**63}, "seed", "2**63"),
        ({"stop": ("x" * 513,)}, "stop", "512"),
        ({"stop": tuple("abcdefghijklmnopq")}, "stop", "16"),
        ({"stop_token_ids": (2**31,)}, "stop_token_ids", str(2**31)),
    ],
)
def test_out_of_range_is_named(params: dict[str, Any], field: str, text: str) -> None:
    with pytest.raises(ParamError) as info:
        SamplingParams(**params).check()
    assert info.value.field == field
    assert text in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"temperature": 0},  # an int where a float belongs is fine
        {"temperature": 1e-30, "top_p": 1e-30, "min_p": 1.0, "repetition_penalty": 1e30},
        {"presence_penalty": -0.0, "frequency_penalty": 2.0},
        {"max_tokens": 2**31 - 1, "top_k": -1, "seed": 2**63 - 1},
        {"priority": -(2**31 - 1)},
        {"priority": 2**31 - 1},
        {"stop": ("x" * 512,) * 16},
    ],
)
def test_edges_inside_the_limits_pass(params: dict[str, Any]) -> None:
    SamplingParams(**params).check()


def test_stop_token_ids_use_the_vocabulary_when_known() -> None:
    SamplingParams(stop_token_ids=(99,)).check(vocab_size=100)
    with pytest.raises(ParamError, match=r"\[0, 100\)"):
        SamplingParams(stop_token_ids=(100,)).check(vocab_size=100)
