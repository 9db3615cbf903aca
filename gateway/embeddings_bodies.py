"""POST /v1/embeddings bodies (OpenAI's, with vLLM's extras) -> inputs + SamplingParams, or a
named 400.

    {"model", "input": str | [str, ...] | [int, ...] | [[int, ...], ...],
     "encoding_format": "float" | "base64", "dimensions", "user",
     "normalize" | "use_activation" (vLLM's, default true), "priority" (vLLM's)}

Each input runs as an engine request of its own that pools the prompt (`SamplingParams.
pooling`, the server's `--pooling-type`) and generates one token nobody reads. `dimensions`
is refused, as vLLM refuses it for a model not trained for Matryoshka representations: cutting
such a vector short changes what it means.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import msgspec
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.openai_bodies import decode_body
from troupe.messages import ParamError, Pooling, SamplingParams
from troupe.messages.pooling import PoolingType

EncodingFormat = Literal["float", "base64"]


class EmbeddingBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # OpenAI's: a text, token ids, or a list of either (checked after decoding)
    input: str | list[str | int | list[int]]
    model: str | None = None
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    user: str | None = None  # accepted: an end-user id for the operator's logs
    # vLLM's extras: `normalize` (until v0.11), renamed `use_activation` since
    normalize: bool | None = None
    use_activation: bool | None = None
    priority: int | None = None  # lower is served first


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingRequest:
    """A checked request: the inputs to pool, how, and how to answer."""

    model: str | None
    inputs: tuple[str | list[int], ...]
    params: SamplingParams
    encoding_format: EncodingFormat
    user: str | None
    is_list: bool  # `input` was a list of inputs: a rejection names `input[i]`, never `input`


def parse_embedding_request(
    raw: bytes, *, served_model: str, pooling_type: PoolingType, max_inputs: int
) -> EmbeddingRequest:
    """Decode and check a JSON body; raise ApiError(400) naming the first bad field."""
    body = decode_body(raw, EmbeddingBody)
    if body.dimensions is not None:
        raise no_dimensions(served_model)
    inputs, is_list = pooled_inputs(body.input)
    if len(inputs) > max_inputs:
        raise invalid("input", f"at most {max_inputs} inputs per request, got {len(inputs)}")
    normalize = _normalize(body)
    params = SamplingParams(
        max_tokens=1,
        temperature=0.0,
        pooling=Pooling(type=pooling_type, normalize=normalize),
        priority=0 if body.priority is None else body.priority,
    )
    try:
        params.check()
    except ParamError as exc:
        raise invalid(exc.field, str(exc)) from None
    return EmbeddingRequest(
        model=body.model,
        inputs=inputs,
        params=params,
        encoding_format=body.encoding_format,
        user=body.user,
        is_list=is_list,
    )


def no_dimensions(served_model: str) -> ApiError:
    """The 400 for `dimensions`, vLLM's words for a model without Matryoshka training."""
    return invalid(
        "dimensions",
        f'Model "{served_model}" does not support matryoshka representation, changing '
        "output dimensions will lead to poor results.",
    )


def pooled_inputs(
    given: str | list[str | int | list[int]],
) -> tuple[tuple[str | list[int], ...], bool]:
    """(the inputs, whether `input` listed them): a text or token ids are one input; a list of
    texts or token-id lists is several. None may be empty (OpenAI's rule)."""
    if isinstance(given, str):
        if not given:
            raise invalid("input", "'input' must not be an empty string")
        return (given,), False
    kinds = set(map(type, given))  # one C-speed pass: inputs run to thousands of ids
    if kinds == {int}:  # msgspec decoded it: ints only, never bools
        return (given,), False  # type: ignore[return-value]  # a list[int] by its kinds
    if not given or int in kinds:
        raise invalid(
            "input",
            "'input' must be a non-empty string, a non-empty list of token ids, or a non-empty "
            "list of strings or of token-id lists",
        )
    inputs = tuple(p for p in given if not isinstance(p, int))
    for i, one in enumerate(inputs):
        if not one:
            what = "an empty string" if isinstance(one, str) else "an empty list of token ids"
            raise invalid(f"input[{i}]", f"'input[{i}]' must not be {what}")
    return inputs, True


def _normalize(body: EmbeddingBody) -> bool:
    """vLLM's `normalize` and its later name `use_activation`: either, or both alike."""
    given = {k: v for k in ("normalize", "use_activation") if (v := getattr(body, k)) is not None}
    if len(set(given.values())) > 1:
        raise invalid("use_activation", "normalize and use_activation disagree: send one")
    return next(iter(given.values()), True)


__all__ = [
    "EmbeddingBody",
    "EmbeddingRequest",
    "EncodingFormat",
    "no_dimensions",
    "parse_embedding_request",
    "pooled_inputs",
]
