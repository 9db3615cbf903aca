"""SGLang's native POST /generate bodies -> prompts and SamplingParams, or a 400 naming the field.

    {"text": str | [str, ...]} or {"input_ids": [int, ...] | [[int, ...], ...]},
    "sampling_params": {...} | [{...} per prompt], "stream", "rid", "return_logprob",
    "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "lora_path"

`sampling_params` keys are SGLang's (`max_new_tokens`, default 128; `min_new_tokens`;
`no_stop_trim`; `json_schema`, `regex`, `ebnf`; `sampling_seed`; the usual temperature, top_p,
top_k, min_p, penalties, stop, stop_token_ids, ignore_eos, skip_special_tokens, n, logit_bias),
each mapped onto its SamplingParams field; a key troupe does not serve is refused by name. A
list gives each prompt its own; their `n` must agree (SGLang's rule). The engine's sampling
defaults fill what a prompt's params leave out, as on the OpenAI routes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from troupe.gateway.errors import ApiError, invalid
from troupe.gateway.openai_bodies import MAX_REQUEST_ID, decode_body
from troupe.gateway.openai_requests import logit_bias_ids
from troupe.messages import ParamError, SamplingParams, StructuredOutputs
from troupe.messages.sampling_defaults import SamplingDefaults

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's


class SGLangSampling(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None  # the stop string stays in the text
    n: int | None = None
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None


class GenerateBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    text: str | list[str] | None = None
    input_ids: list[int | list[int]] | None = None  # one prompt's ids, or a list of them
    sampling_params: SGLangSampling | list[SGLangSampling] | None = None
    stream: bool = False
    rid: str | list[str] | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    lora_path: str | None = None  # a served LoRA adapter's name


@dataclasses.dataclass(frozen=True)
class GenerateCall:
    """A checked /generate request: one engine request per prompt, each with its params."""

    prompts: list[str | list[int]]
    params: list[SamplingParams]
    is_batch: bool  # a list of prompts was sent: the answer is a list (also when n > 1)
    # max_new_tokens 0 (SGLang's prefill-only call, for the prompt's logprobs): the engine
    # runs one token, which is not shown
    is_prompt_only: bool
    rids: list[str] | None  # the client's, one per prompt
    stream: bool
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    return_text_in_logprobs: bool
    lora_path: str | None

    @property
    def n(self) -> int:
        return self.params[0].n


# SamplingParams fields under another name in SGLang's sampling_params
_RENAMED = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens",
            "include_stop_str_in_output": "no_stop_trim", "seed": "sampling_seed"}  # fmt: skip
_PASSTHROUGH = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                "presence_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens",
                "n")  # fmt: skip
# the field a client wrote, for each engine field a rejection may name
CLIENT_FIELDS = {
    **{f: f"sampling_params.{_RENAMED.get(f, f)}" for f in SamplingParams.__struct_fields__},
    "logprobs": "top_logprobs_num",
    "prompt_logprobs": "top_logprobs_num",
    "structured_outputs": "sampling_params",
    "prompt": "text",
    "prompt_token_ids": "input_ids",
}


def in_sglang_terms(error: ApiError) -> ApiError:
    """`error` (naming SGLang's field already) with its message saying that field's name where
    it says the engine's (`max_tokens` -> `max_new_tokens`)."""
    for field, key in _RENAMED.items():
        if error.param == f"sampling_params.{key}":
            error.message = error.message.replace(field, key, 1)
    return error


def parse_generate(raw: bytes, defaults: SamplingDefaults) -> GenerateCall:
    body = decode_body(raw, GenerateBody)
    if (body.text is None) == (body.input_ids is None):
        raise invalid("text", "send exactly one of 'text' and 'input_ids'")
    prompts: list[str | list[int]]
    if isinstance(body.text, str):
        prompts, is_batch = [body.text], False
    elif body.text is not None:
        prompts, is_batch = list(body.text), True
    else:
        prompts, is_batch = _id_prompts(body.input_ids or [])
    if not prompts:
        raise invalid("text" if body.text is not None else "input_ids", "no prompt was given")
    given = body.sampling_params
    sampling = given if isinstance(given, list) else [given or SGLangSampling()] * len(prompts)
    if len(sampling) != len(prompts):
        raise invalid(
            "sampling_params",
            f"sampling_params lists {len(sampling)} entries for {len(prompts)} prompts",
        )
    rids = _rids(body.rid, len(prompts), is_batch)
    _check_logprob_fields(body)
    params = [_params(s, body, defaults) for s in sampling]
    zero = {s.max_new_tokens == 0 for s in sampling}
    if len(zero) > 1:
        raise invalid("sampling_params.max_new_tokens", "max_new_tokens 0 must be every prompt's")
    if len({p.n for p in params}) > 1:
        raise invalid("sampling_params.n", "every prompt of a batch must ask for the same n")
    return GenerateCall(
        prompts=prompts,
        params=params,
        is_batch=is_batch,
        is_prompt_only=zero == {True},
        rids=rids,
        stream=body.stream,
        return_logprob=body.return_logprob,
        logprob_start_len=body.logprob_start_len,
        top_logprobs_num=body.top_logprobs_num,
        return_text_in_logprobs=body.return_text_in_logprobs,
        lora_path=body.lora_path,
    )


def _id_prompts(given: list[int | list[int]]) -> tuple[list[str | list[int]], bool]:
    """(the prompts, whether a batch was sent) of `input_ids`: ids, or lists of them."""
    flat = [t for t in given if isinstance(t, int)]
    if len(flat) == len(given):
        return [flat], False
    if flat:
        raise invalid("input_ids", "input_ids must be token ids or lists of them, not both")
    return [list(ids) for ids in given if isinstance(ids, list)], True


def _rids(rid: str | list[str] | None, num_prompts: int, is_batch: bool) -> list[str] | None:
    """Each prompt's rid: a list names each; one string names a lone prompt, or is the
    prefix of a batch's (`rid_0`, `rid_1`, ... as SGLang expands it)."""
    if rid is None:
        return None
    if isinstance(rid, str):
        rids = [f"{rid}_{i}" for i in range(num_prompts)] if is_batch else [rid]
    elif len(rid) != num_prompts:
        raise invalid("rid", f"rid lists {len(rid)} ids for {num_prompts} prompts")
    else:
        rids = rid
    if not all(0 < len(r) <= MAX_REQUEST_ID for r in rids):
        raise invalid("rid", f"each rid must be 1 to {MAX_REQUEST_ID} characters")
    return list(rids)


def _check_logprob_fields(body: GenerateBody) -> None:
    if body.logprob_start_len < -1:
        raise invalid("logprob_start_len", "logprob_start_len must be -1 (none) or >= 0")
    if body.top_logprobs_num < 0:
        raise invalid("top_logprobs_num", "top_logprobs_num must be >= 0")
    for name in ("top_logprobs_num", "return_text_in_logprobs"):
        if getattr(body, name) and not body.return_logprob:
            raise invalid(name, f"{name} needs return_logprob: true")
    if body.logprob_start_len >= 0 and not body.return_logprob:
        raise invalid("logprob_start_len", "logprob_start_len needs return_logprob: true")
    if body.stream and body.logprob_start_len >= 0:
        raise invalid("logprob_start_len", "the prompt's logprobs cannot be streamed here")


def _params(s: SGLangSampling, body: GenerateBody, defaults: SamplingDefaults) -> SamplingParams:
    kw: dict[str, Any] = {k: getattr(s, k) for k in _PASSTHROUGH if getattr(s, k) is not None}
    max_new = DEFAULT_MAX_NEW_TOKENS if s.max_new_tokens is None else s.max_new_tokens
    kw["max_tokens"] = max_new or 1  # 0: the engine runs one token, not shown
    kw["strict_max_tokens"] = s.max_new_tokens is not None  # named: must fit, as SGLang says
    for field, key in _RENAMED.items():
        if field != "max_tokens" and (value := getattr(s, key)) is not None:
            kw[field] = value
    if s.stop is not None:
        kw["stop"] = (s.stop,) if isinstance(s.stop, str) else tuple(s.stop)
    if s.stop_token_ids:
        kw["stop_token_ids"] = tuple(s.stop_token_ids)
    if s.logit_bias:
        kw["logit_bias"] = logit_bias_ids(s.logit_bias, "sampling_params.logit_bias")
    kw["structured_outputs"] = _constraint(s)
    if body.return_logprob:
        kw["logprobs"] = body.top_logprobs_num
        kw["return_prompt_token_ids"] = True  # the rows name the prompt's ids
        if body.logprob_start_len >= 0:
            kw["prompt_logprobs"] = body.top_logprobs_num
    params = SamplingParams(**defaults.fill(kw))
    try:
        params.check()
    except ParamError as exc:
        raise in_sglang_terms(invalid(CLIENT_FIELDS.get(exc.field, exc.field), str(exc))) from None
    return params


def _constraint(s: SGLangSampling) -> StructuredOutputs | None:
    given = [(k, v) for k, v in (("json_schema", s.json_schema), ("regex", s.regex),
                                 ("ebnf", s.ebnf)) if v is not None]  # fmt: skip
    if len(given) > 1:
        names = " and ".join(k for k, _ in given)
        raise invalid(f"sampling_params.{given[1][0]}", f"only one constraint at a time: {names}")
    if not given:
        return None
    key, value = given[0]
    if key == "json_schema":
        return StructuredOutputs(json=value)
    return StructuredOutputs(regex=value) if key == "regex" else StructuredOutputs(grammar=value)
