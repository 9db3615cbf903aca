"""POST /v1/score and /v1/rerank bodies (vLLM's shapes) -> texts, pairs and SamplingParams, or a
named 400.

    /v1/score   {"model", "text_1": str | [str, ...], "text_2": str | [str, ...],
                 "truncate_prompt_tokens", "priority", "encoding_format"}
    /v1/rerank  {"model", "query": str, "documents": [str | {"text": str}, ...],
                 "top_n" (0 or absent: every document), "return_documents" (default true),
                 "truncate_prompt_tokens", "priority"}

text_1 is one text scored against each of text_2 (1:1, 1:N), or as many texts as text_2,
scored index by index (N:N); a rerank is the 1:N case, the query against each document. Every
text runs as an engine request that pools it as /v1/embeddings does (the server's
`--pooling-type`), so the texts a request names, counted as given, are bounded by the same
`--max-embedding-inputs`. `encoding_format` is accepted for clients that send the embeddings
body's fields: a score is a JSON number either way.
"""

from __future__ import annotations

import dataclasses

import msgspec
from troupe.actors.score_pairs import Named, Pairing, pair_texts
from troupe.gateway.embeddings_bodies import EncodingFormat
from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import decode_body
from troupe.messages import ParamError, Pooling, SamplingParams
from troupe.messages.pooling import PoolingType

_LIMIT = "the server's --max-embedding-inputs"


class _Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    truncate_prompt_tokens: int | None = None  # vLLM's: keep each text's last k tokens
    priority: int | None = None  # vLLM's: lower is served first


class ScoreBody(_Body, kw_only=True):
    text_1: str | list[str]
    text_2: str | list[str]
    encoding_format: EncodingFormat = "float"


class RerankDocument(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    text: str  # Jina's and Cohere's document object


class RerankBody(_Body, kw_only=True):
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = None
    return_documents: bool = True  # Jina's default; vLLM always returns them


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoreRequest:
    """A checked /v1/score request."""

    model: str | None
    pairing: Pairing
    params: SamplingParams


@dataclasses.dataclass(frozen=True, kw_only=True)
class RerankRequest:
    """A checked /v1/rerank request: the query is text 0 of the pairing's 1:N pairs."""

    model: str | None
    pairing: Pairing
    params: SamplingParams
    documents: tuple[str, ...]
    top_n: int  # results to answer with, at most len(documents)
    return_documents: bool


def parse_score_request(raw: bytes, *, pooling_type: PoolingType, max_texts: int) -> ScoreRequest:
    """Decode and check a /v1/score body; raise ApiError(400) naming the first bad field."""
    body = decode_body(raw, ScoreBody)
    left, right = _named("text_1", body.text_1), _named("text_2", body.text_2)
    if len(left) + len(right) > max_texts:
        field = "text_1" if len(left) > max_texts else "text_2"
        raise invalid(
            field,
            f"at most {max_texts} texts per request ({_LIMIT}), got {len(left) + len(right)}: "
            f"{len(left)} in text_1 and {len(right)} in text_2",
        )
    if len(left) not in (1, len(right)):
        raise invalid(
            "text_1",
            f"text_1 lists {len(left)} texts and text_2 {len(right)}: score one text_1 against "
            "any number of text_2 (1:1, 1:N), or as many text_1 as text_2 (N:N)",
        )
    params = _params(body, pooling_type)
    return ScoreRequest(model=body.model, pairing=pair_texts(left, right), params=params)


def parse_rerank_request(raw: bytes, *, pooling_type: PoolingType, max_texts: int) -> RerankRequest:
    """Decode and check a /v1/rerank body; raise ApiError(400) naming the first bad field."""
    body = decode_body(raw, RerankBody)
    query = _named("query", body.query)
    given = [d if isinstance(d, str) else d.text for d in body.documents]
    documents = _named("documents", given)
    if 1 + len(documents) > max_texts:
        raise invalid(
            "documents",
            f"at most {max_texts} texts per request ({_LIMIT}), got {1 + len(documents)}: "
            f"the query and {len(documents)} documents",
        )
    top_n = body.top_n or len(documents)  # vLLM's and Jina's: 0 or absent is every document
    if top_n < 0:
        raise invalid("top_n", f"top_n must be >= 0 (0: every document), got {top_n}")
    return RerankRequest(
        model=body.model,
        pairing=pair_texts(query, documents),
        params=_params(body, pooling_type),
        documents=tuple(given),
        top_n=min(top_n, len(documents)),
        return_documents=body.return_documents,
    )


def _named(field: str, given: str | list[str]) -> list[Named]:
    """Each text with where the client gave it; none may be empty, nor a list."""
    if isinstance(given, str):
        if not given:
            raise invalid(field, f"'{field}' must not be an empty string")
        return [(field, given)]
    if not given:
        raise invalid(field, f"'{field}' must name at least one text")
    for i, text in enumerate(given):
        if not text:
            raise invalid(f"{field}[{i}]", f"'{field}[{i}]' must not be an empty string")
    return [(f"{field}[{i}]", text) for i, text in enumerate(given)]


def _params(body: _Body, pooling_type: PoolingType) -> SamplingParams:
    """Each text's engine request: pooled (normalized, as /v1/embeddings answers by default, so
    a score is the cosine of the vectors that endpoint gives) and one token nobody reads."""
    params = SamplingParams(
        max_tokens=1,
        temperature=0.0,
        pooling=Pooling(type=pooling_type, normalize=True),
        priority=0 if body.priority is None else body.priority,
        truncate_prompt_tokens=body.truncate_prompt_tokens,
    )
    try:
        params.check()
    except ParamError as exc:
        raise invalid(exc.field, str(exc)) from None
    return params


__all__ = [
    "RerankBody",
    "RerankRequest",
    "ScoreBody",
    "ScoreRequest",
    "parse_rerank_request",
    "parse_score_request",
]
