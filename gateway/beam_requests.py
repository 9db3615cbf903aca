"""vLLM's `use_beam_search` and `length_penalty` extras -> BeamSearchParams, or a named 400.

As vLLM's `to_beam_search_params`: the beam width is `n`, with the request's `max_tokens`,
`ignore_eos` and `length_penalty` (vLLM's default 1.0). The sampling knobs (temperature,
top_p, top_k, min_p, seed, priority) are accepted and unused, as in vLLM: beams rank by the
model's raw logprobs. What would change which tokens come out, or asks for what a beam does
not carry, is refused by name instead of being dropped without a word (vLLM drops it):
stop strings and ids, logit_bias, min_tokens, allowed_token_ids, bad_words,
truncate_prompt_tokens, penalties, structured output, tools, logprobs,
prompt_logprobs, best_of other than n, streaming_window; and, as vLLM, a streamed completion
(the beams are known at the end; chat streams them then, as vLLM's chat does).
"""

from __future__ import annotations

from troupe.actors.beam_search import BeamSearchParams
from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import ChatBody, CompletionBody
from troupe.gateway.tool_calls import ToolPlan
from troupe.messages import ParamError, SamplingParams

# SamplingParams fields a beam search cannot honour, and the values that ask for nothing.
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "stop": ((),),
    "stop_token_ids": ((),),
    "logit_bias": (None,),
    "min_tokens": (0,),
    "allowed_token_ids": (None,),
    "bad_words": (None,),
    "truncate_prompt_tokens": (None,),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "repetition_penalty": (1.0,),
    "prompt_logprobs": (None,),
    "streaming_window": (None, 0),
    "sink_tokens": (None, 0),
}


def beam_params(
    body: CompletionBody | ChatBody,
    params: SamplingParams,
    *,
    tools: ToolPlan | None,
    client_fields: dict[str, str],
    max_tokens_field: str,
    is_echo_only: bool,
) -> BeamSearchParams | None:
    """The beam search a checked request asks for (None: it asks for none)."""
    if not body.use_beam_search:
        if body.length_penalty is not None and body.length_penalty != 1.0:
            raise invalid("length_penalty", "length_penalty needs use_beam_search: true")
        return None
    if isinstance(body, CompletionBody) and body.stream:
        raise invalid(
            "stream",
            "use_beam_search cannot stream a completion (as in vLLM): the beams are known at "
            "the end; leave stream off",
        )
    if body.stream_options is not None and body.stream_options.continuous_usage_stats:
        raise invalid(
            "stream_options.continuous_usage_stats",
            "use_beam_search sends its beams at the end: there are no running counts",
        )
    _refuse_with_beams(body, params, tools, client_fields)
    if is_echo_only:
        raise invalid(max_tokens_field, "use_beam_search needs max_tokens >= 1")
    beam = BeamSearchParams(
        beam_width=params.n,
        max_tokens=params.max_tokens,
        ignore_eos=params.ignore_eos,
        length_penalty=1.0 if body.length_penalty is None else body.length_penalty,
        lora=params.lora,
        cache_salt=params.cache_salt,
    )
    try:
        beam.check()
    except ParamError as exc:
        renamed = {"beam_width": "n", "max_tokens": max_tokens_field}
        field = renamed.get(exc.field, exc.field)
        message = str(exc).replace("beam_width", "n")  # the client's name for the width
        raise invalid(field, message) from None
    return beam


def _refuse_with_beams(
    body: CompletionBody | ChatBody,
    params: SamplingParams,
    tools: ToolPlan | None,
    client_fields: dict[str, str],
) -> None:
    """A 400 naming the first field a beam search cannot honour."""
    if tools is not None:
        raise invalid("tools", "use_beam_search cannot be combined with tool calls")
    if params.structured_outputs is not None:
        field = next(iter(client_fields.values()), "structured_outputs")
        raise invalid(field, "use_beam_search cannot be combined with structured output")
    if params.logprobs is not None:  # chat's top_logprobs needs logprobs: true
        raise invalid("logprobs", "use_beam_search does not return logprobs: leave them out")
    if isinstance(body, CompletionBody) and body.best_of not in (None, params.n):
        raise invalid("best_of", "use_beam_search returns the n best beams: leave best_of out")
    for name, neutral in _NEUTRAL.items():
        if getattr(params, name) not in neutral:
            raise invalid(name, f"use_beam_search cannot be combined with {name}")
