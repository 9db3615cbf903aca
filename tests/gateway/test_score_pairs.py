"""The pure part of /v1/score and /v1/rerank: how texts pair (1:1, 1:N, N:N; each distinct text
once, named where the client first gave it), what a pair scores (cosine similarity), and the
bodies' checks (pairing rule, the texts limit, empty texts, top_n) with the field each names."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from troupe.actors.score_pairs import cosine_scores, pair_texts
from troupe.gateway.errors import ApiError
from troupe.gateway.score_bodies import parse_rerank_request, parse_score_request


def _named(field: str, texts: list[str]) -> list[tuple[str, str]]:
    return [(f"{field}[{i}]", t) for i, t in enumerate(texts)]


def test_one_against_many_embeds_each_text_once() -> None:
    pairing = pair_texts([("text_1", "q")], _named("text_2", ["a", "q", "b", "a"]))
    assert pairing.texts == ("q", "a", "b")
    assert pairing.names == ("text_1", "text_2[0]", "text_2[2]")
    assert pairing.pairs == ((0, 1), (0, 0), (0, 2), (0, 1))
    assert pairing.num_scores == 4


def test_n_against_n_pairs_by_index() -> None:
    pairing = pair_texts(_named("text_1", ["x", "y", "x"]), _named("text_2", ["a", "x", "b"]))
    assert pairing.texts == ("x", "y", "a", "b")
    assert pairing.pairs == ((0, 2), (1, 0), (0, 3))


def test_one_against_one() -> None:
    pairing = pair_texts([("text_1", "x")], [("text_2", "y")])
    assert (pairing.texts, pairing.pairs) == (("x", "y"), ((0, 1),))


def test_cosine_of_known_vectors() -> None:
    vectors = [(1.0, 0.0), (0.0, 3.0), (-2.0, 0.0), (0.0, 0.0), (1.0, 1.0)]
    scores = cosine_scores(vectors, [(0, 1), (0, 2), (0, 0), (0, 3), (0, 4), (4, 1)])
    assert scores[:4] == [0.0, -1.0, 1.0, 0.0]  # orthogonal, opposite, itself, a zero vector
    assert scores[4] == pytest.approx(1 / math.sqrt(2), abs=1e-15)
    assert scores[5] == pytest.approx(1 / math.sqrt(2), abs=1e-15)  # the length does not count


@given(
    st.lists(st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3), min_size=2, max_size=5).filter(
        lambda vs: all(any(abs(x) > 1e-3 for x in v) for v in vs)
    )
)
def test_cosine_matches_its_definition(vectors: list[list[float]]) -> None:
    pairs = [(i, j) for i in range(len(vectors)) for j in range(len(vectors))]
    for (i, j), score in zip(pairs, cosine_scores(vectors, pairs), strict=True):
        a, b = vectors[i], vectors[j]
        want = sum(x * y for x, y in zip(a, b, strict=True)) / math.hypot(*a) / math.hypot(*b)
        assert -1.0 <= score <= 1.0
        assert score == pytest.approx(want, abs=1e-9)


def _score(body: dict[str, Any], max_texts: int = 8) -> Any:
    return parse_score_request(json.dumps(body).encode(), pooling_type="last", max_texts=max_texts)


def _rerank(body: dict[str, Any], max_texts: int = 8) -> Any:
    raw = json.dumps(body).encode()
    return parse_rerank_request(raw, pooling_type="mean", max_texts=max_texts)


def _refused(parse: Any, body: dict[str, Any], **kw: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body, **kw)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("text_1", "text_2", "num_scores"),
    [("q", "d", 1), ("q", ["a", "b", "c"], 3), (["q"], ["a", "b"], 2), (["x", "y"], ["a", "b"], 2)],
)
def test_pairing_rules_accepted(text_1: Any, text_2: Any, num_scores: int) -> None:
    req = _score({"text_1": text_1, "text_2": text_2})
    assert req.pairing.num_scores == num_scores
    assert req.params.pooling.type == "last" and req.params.pooling.normalize
    assert req.params.max_tokens == 1


@pytest.mark.parametrize(
    ("text_1", "text_2"), [(["x", "y"], ["a", "b", "c"]), (["x", "y"], "a"), (["x", "y"], ["a"])]
)
def test_n_against_m_is_refused_naming_both(text_1: Any, text_2: Any) -> None:
    error = _refused(_score, {"text_1": text_1, "text_2": text_2})
    assert error.param == "text_1"
    assert "text_1 lists 2 texts and text_2" in error.message and "N:N" in error.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text_1": "", "text_2": "a"}, "text_1"),
        ({"text_1": "q", "text_2": ["a", ""]}, "text_2[1]"),
        ({"text_1": [], "text_2": ["a"]}, "text_1"),
        ({"text_1": "q", "text_2": []}, "text_2"),
        ({"text_1": "q"}, "text_2"),
        ({"text_1": "q", "text_2": [1]}, "text_2[0]"),
        ({"text_1": "q", "text_2": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"text_1": "q", "text_2": "a", "priority": 2**40}, "priority"),
        ({"text_1": "q", "text_2": "a", "encoding_format": "binary"}, "encoding_format"),
        ({"text_1": "q", "text_2": "a", "text_3": "b"}, "text_3"),
    ],
)
def test_score_fields_refused_by_name(body: dict[str, Any], param: str) -> None:
    assert _refused(_score, body).param == param


def test_texts_per_request_are_bounded() -> None:
    assert _score({"text_1": "q", "text_2": ["a", "b"]}, max_texts=3).pairing.num_scores == 2
    error = _refused(_score, {"text_1": "q", "text_2": ["a", "b", "c"]}, max_texts=3)
    assert error.param == "text_2"
    assert "at most 3 texts" in error.message and "--max-embedding-inputs" in error.message
    error = _refused(_score, {"text_1": ["a"] * 4, "text_2": ["b"] * 4}, max_texts=3)
    assert error.param == "text_1"
    error = _refused(_rerank, {"query": "q", "documents": ["a", "b", "c"]}, max_texts=3)
    assert error.param == "documents" and "--max-embedding-inputs" in error.message


def test_rerank_documents_top_n_and_pooling() -> None:
    req = _rerank({"query": "q", "documents": ["a", {"text": "b"}, "q"], "top_n": 2})
    assert req.documents == ("a", "b", "q")
    assert req.pairing.texts == ("q", "a", "b") and req.pairing.names[0] == "query"
    assert req.pairing.pairs == ((0, 1), (0, 2), (0, 0))
    assert (req.top_n, req.return_documents) == (2, True)
    assert req.params.pooling.type == "mean"  # the server's --pooling-type
    assert _rerank({"query": "q", "documents": ["a", "b"]}).top_n == 2  # absent: every one
    assert _rerank({"query": "q", "documents": ["a", "b"], "top_n": 0}).top_n == 2
    assert _rerank({"query": "q", "documents": ["a"], "top_n": 5}).top_n == 1
    off = _rerank({"query": "q", "documents": ["a"], "return_documents": False})
    assert off.return_documents is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": "", "documents": ["a"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["a", {"text": ""}]}, "documents[1]"),
        ({"query": "q", "documents": [{"title": "a"}]}, "documents[0].title"),
        ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ({"query": ["q"], "documents": ["a"]}, "query"),
    ],
)
def test_rerank_fields_refused_by_name(body: dict[str, Any], param: str) -> None:
    assert _refused(_rerank, body).param == param
