"""POST /classify bodies (vLLM's `ClassificationCompletionRequest`) -> inputs + SamplingParams,
or a named 400.

    {"model", "input": str | [str, ...] | [int, ...] | [[int, ...], ...],
     "truncate_prompt_tokens", "use_activation" (default true; old names "activation",
     "softmax"), "user", "priority"}

Each input runs as an engine request of its own that pools its last prompt token through the
model's score head (`Pooling(type="last", task="classify")`, messages/pooling.py: the token
transformers' `*ForSequenceClassification` pools) and generates one token nobody reads.
"""

from __future__ import annotations

import dataclasses

import msgspec
from troupe.gateway.embeddings_bodies import pooled_inputs
from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import decode_body
from troupe.messages import ParamError, Pooling, SamplingParams


class ClassifyBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input: str | list[str | int | list[int]]
    model: str | None = None
    truncate_prompt_tokens: int | None = None
    # vLLM's: `use_activation`, earlier `activation` and `softmax` (all default true)
    use_activation: bool | None = None
    activation: bool | None = None
    softmax: bool | None = None
    user: str | None = None  # accepted: an end-user id for the operator's logs
    priority: int | None = None  # lower is served first


# vLLM's `use_activation` and its earlier names, all one flag
ACTIVATION_NAMES = ("use_activation", "activation", "softmax")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifyRequest:
    """A checked request: the inputs to classify, how, and how to answer."""

    model: str | None
    inputs: tuple[str | list[int], ...]
    params: SamplingParams
    user: str | None
    is_list: bool  # `input` was a list of inputs: a rejection names `input[i]`, never `input`


def parse_classify_request(raw: bytes, *, max_inputs: int) -> ClassifyRequest:
    """Decode and check a JSON body; raise ApiError(400) naming the first bad field."""
    body = decode_body(raw, ClassifyBody)
    inputs, is_list = pooled_inputs(body.input)
    if len(inputs) > max_inputs:
        raise invalid("input", f"at most {max_inputs} inputs per request, got {len(inputs)}")
    params = SamplingParams(
        max_tokens=1,
        temperature=0.0,
        pooling=Pooling(
            type="last", normalize=agreed_flag(body, ACTIVATION_NAMES), task="classify"
        ),
        truncate_prompt_tokens=body.truncate_prompt_tokens,
        priority=0 if body.priority is None else body.priority,
    )
    try:
        params.check()
    except ParamError as exc:
        raise invalid(exc.field, str(exc)) from None
    return ClassifyRequest(
        model=body.model, inputs=inputs, params=params, user=body.user, is_list=is_list
    )


def agreed_flag(body: msgspec.Struct, names: tuple[str, ...]) -> bool:
    """vLLM's `use_activation` and its other names (`names`, as fields of `body`): any of
    them, all alike (default true); disagreeing ones are a 400 naming `use_activation`."""
    given = {k: v for k in names if (v := getattr(body, k)) is not None}
    if len(set(given.values())) > 1:
        raise invalid("use_activation", f"{', '.join(given)} disagree: send one")
    return bool(next(iter(given.values()), True))
