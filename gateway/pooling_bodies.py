"""POST /pooling bodies (vLLM's `PoolingCompletionRequest`) -> inputs + SamplingParams, or a
named 400.

    {"model", "input": str | [str, ...] | [int, ...] | [[int, ...], ...],
     "task": "embed" | "classify" | "token_embed" | "token_classify" (default: the model's),
     "truncate_prompt_tokens",
     "encoding_format": "float" | "base64", "use_activation" (default true; older names
     "normalize", "activation", "softmax"), "dimensions" (refused), "user", "priority"}

/pooling is vLLM's generic pooling call. `task` picks among the model's tasks (vLLM's
supported tasks, the first the default; another is a 400 naming `task`):

    model                           tasks
    embedding (causal LM)           embed, token_embed
    *ForSequenceClassification      classify, token_classify
    *ForTokenClassification         token_classify

embed: the server's `--pooling-type`, `use_activation` the unit L2 norm; classify: the last
token through the score head, `use_activation` the classifier's activation; the per-token
tasks give a row per prompt token (messages/pooling.py): token_embed each final hidden state
(`use_activation`: each to unit norm), token_classify each one's label scores (softmax; sigmoid for one label).
"""

from __future__ import annotations

import dataclasses

import msgspec
from troupe.gateway.classify_bodies import agreed_flag
from troupe.gateway.embeddings_bodies import EncodingFormat, no_dimensions, pooled_inputs
from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import decode_body
from troupe.messages import ParamError, Pooling, SamplingParams
from troupe.messages.pooling import PoolingTask, PoolingType

# vLLM's pooling tasks; those no model here serves are refused by name
_VLLM_TASKS = ("embed", "classify", "token_embed", "token_classify", "score", "encode")


class PoolingBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input: str | list[str | int | list[int]]
    model: str | None = None
    task: str | None = None
    truncate_prompt_tokens: int | None = None
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    # vLLM's `use_activation`; earlier `normalize` (embeddings), `activation`, `softmax`
    use_activation: bool | None = None
    normalize: bool | None = None
    activation: bool | None = None
    softmax: bool | None = None
    user: str | None = None  # accepted: an end-user id for the operator's logs
    priority: int | None = None  # lower is served first


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolingRequest:
    """A checked request: the inputs to pool, how, and how to answer."""

    model: str | None
    inputs: tuple[str | list[int], ...]
    params: SamplingParams
    task: PoolingTask
    encoding_format: EncodingFormat
    user: str | None
    is_list: bool  # `input` was a list of inputs: a rejection names `input[i]`, never `input`


def parse_pooling_request(
    raw: bytes,
    *,
    served_model: str,
    model_tasks: tuple[PoolingTask, ...],
    pooling_type: PoolingType,
    max_inputs: int,
) -> PoolingRequest:
    """Decode and check a JSON body for a model serving `model_tasks` (the first its
    default, `served_tasks()`); raise ApiError(400) naming the first bad field."""
    body = decode_body(raw, PoolingBody)
    task = _task(body.task, model_tasks, served_model)
    if body.dimensions is not None:
        raise no_dimensions(served_model)
    inputs, is_list = pooled_inputs(body.input)
    if len(inputs) > max_inputs:
        raise invalid("input", f"at most {max_inputs} inputs per request, got {len(inputs)}")
    flag = agreed_flag(body, ("use_activation", "normalize", "activation", "softmax"))
    if task == "embed":
        pooling = Pooling(type=pooling_type, normalize=flag)
    else:  # classify pools the last token as transformers does; per-token tasks read all
        pooling = Pooling(type="last", normalize=flag, task=task)
    params = SamplingParams(
        max_tokens=1,
        temperature=0.0,
        pooling=pooling,
        truncate_prompt_tokens=body.truncate_prompt_tokens,
        priority=0 if body.priority is None else body.priority,
    )
    try:
        params.check()
    except ParamError as exc:
        raise invalid(exc.field, str(exc)) from None
    return PoolingRequest(
        model=body.model,
        inputs=inputs,
        params=params,
        task=task,
        encoding_format=body.encoding_format,
        user=body.user,
        is_list=is_list,
    )


def served_tasks(num_labels: int, is_token_classifier: bool) -> tuple[PoolingTask, ...]:
    """The tasks a model serves, its default first (actors/core/pooling_task.py's table)."""
    if not num_labels:
        return ("embed", "token_embed")
    return ("token_classify",) if is_token_classifier else ("classify", "token_classify")


def _task(given: str | None, tasks: tuple[PoolingTask, ...], served_model: str) -> PoolingTask:
    """The request's task: one of the model's `tasks`, the first when `task` names none."""
    if given is None:
        return tasks[0]
    for task in tasks:
        if task == given:
            return task
    if given not in _VLLM_TASKS:
        raise invalid("task", f"unknown task {given!r}: one of {', '.join(_VLLM_TASKS)}")
    what = {
        "embed": "an embedding",
        "classify": "a sequence-classification",
        "token_classify": "a token-classification",
    }[tasks[0]]
    raise invalid(
        "task",
        f"task {given!r} is not supported: model {served_model!r} is {what} model and "
        f"serves {', '.join(repr(t) for t in tasks)}",
    )
