"""OpenAI request bodies (completions and chat) -> prompt + SamplingParams, or a named 400.

Types come from the Structs in `openai_bodies` (decoded straight from the bytes), ranges from
SamplingParams.check; this module maps OpenAI's names onto troupe's and turns away, by name,
what troupe does not serve yet (suffix, best_of > n streamed, n > 1 with tools, ...). A
completion may carry a list of prompts (`prompts`; gateway/prompt_batch.py runs them). Echo with
logprobs asks the engine for the prompt's logprobs (vLLM's way: gateway/prompt_logprobs.py).
`use_beam_search` makes `beam` (gateway/beam_requests.py; gateway/beam_routes.py answers).
`model` is checked by the route, which knows what is served: it names the base model or a LoRA
adapter (gateway/served_models.py), which `with_lora` puts in the params.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, cast

import msgspec
from troupe.actors.beam_search import BeamSearchParams
from troupe.gateway.beam_requests import beam_params
from troupe.gateway.chat_messages import chat_messages
from troupe.gateway.errors import invalid
from troupe.gateway.openai_bodies import ChatBody, CompletionBody, decode_body
from troupe.gateway.structured_requests import structured_outputs
from troupe.gateway.tool_auto import ToolParserName
from troupe.gateway.tool_calls import ToolPlan, as_sent, tool_plan
from troupe.messages import ChatMessage, ChatPrompt, ParamError, SamplingParams
from troupe.messages.sampling_defaults import NO_DEFAULTS, SamplingDefaults

Kind = Literal["completion", "chat"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenAIRequest:
    """A checked request: what to run and how to answer."""

    kind: Kind
    model: str | None
    # the first of `prompts`; chat: the messages (a ChatPrompt with template options)
    prompt: str | list[int] | list[ChatMessage] | ChatPrompt
    params: SamplingParams
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk carrying usage
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on each chunk
    echo: str | list[int] | None = None  # echo: the prompt (completions), the last message (chat)
    is_echo_only: bool = False  # echo with max_tokens 0: the prompt alone (the engine runs 1)
    user: str | None = None  # OpenAI's end-user id: logged with the request id (debug level)
    # engine field -> the field the client wrote (structured output errors name the latter)
    client_fields: dict[str, str] = dataclasses.field(default_factory=dict)
    tools: ToolPlan | None = None  # chat: the answer is tool calls (gateway/tool_calls.py)
    # completions: every prompt of the request, in order (choices are numbered prompt-major:
    # prompt i's sample j is choice i * n + j, as OpenAI and vLLM number them); chat: ()
    prompts: tuple[str | list[int], ...] = ()
    beam: BeamSearchParams | None = None  # use_beam_search: gateway/beam_routes.py answers
    # vLLM's return_tokens_as_token_ids as sent (None: the server's flag decides)
    tokens_as_ids: bool | None = None
    # completions' prompt_embeds as sent (base64 of torch.save'd tensors; the route decodes
    # them: gateway/prompt_embeds_body.py), each a prompt run before `prompts`, as vLLM orders
    prompt_embeds: tuple[str, ...] = ()
    return_token_ids: bool = False  # vLLM's: token ids beside the text (gateway/token_ids_out.py)
    request_id: str | None = None  # vLLM's: the client's id for the answer (openai_routes)
    include_reasoning: bool = True  # chat, vLLM's: false drops the parsed thinking

    def with_lora(self, lora: str | None) -> OpenAIRequest:
        """This request on the LoRA adapter its `model` selects (gateway/served_models.py;
        None: the base model)."""
        if lora is None:
            return self
        beam = None if self.beam is None else msgspec.structs.replace(self.beam, lora=lora)
        params = msgspec.structs.replace(self.params, lora=lora)
        return dataclasses.replace(self, params=params, beam=beam)


# Fields passed to SamplingParams under the same name (priority included: vLLM's polarity).
_PASSTHROUGH = (
    "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "ignore_eos", "priority", "skip_special_tokens",
    "include_stop_str_in_output", "min_tokens", "streaming_window", "sink_tokens",
    "truncate_prompt_tokens", "cache_salt", "add_special_tokens", "thinking_token_budget",
)  # fmt: skip


def parse_request(
    kind: Kind,
    raw: bytes,
    *,
    default_max_tokens: int,
    tool_parser: ToolParserName | None = None,
    defaults: SamplingDefaults = NO_DEFAULTS,
) -> OpenAIRequest:
    """Decode and check a JSON body; raise ApiError(400) naming the first bad field.
    `tool_parser`: the format tool_choice "auto" replies are parsed in (None: "auto" is
    refused; gateway/tool_auto.py). `defaults`: the engine's, for the sampling fields the body
    leaves out (its max_tokens: the caller's `default_max_tokens`)."""
    body: CompletionBody | ChatBody
    if kind == "completion":
        body = decode_body(raw, CompletionBody)
    else:
        body = decode_body(raw, ChatBody)
    _refuse_unsupported(body)
    kw: dict[str, Any] = {k: getattr(body, k) for k in _PASSTHROUGH if getattr(body, k) is not None}
    max_tokens_field = "max_tokens"
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        max_tokens_field = "max_completion_tokens"
    requested = getattr(body, max_tokens_field)
    kw["max_tokens"] = default_max_tokens if requested is None else requested
    kw["strict_max_tokens"] = requested is not None  # named: must fit (vLLM's 400), not clipped
    if body.stop is not None:
        kw["stop"] = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    if body.stop_token_ids:
        kw["stop_token_ids"] = tuple(body.stop_token_ids)
    kw["n"] = 1 if body.n is None else body.n
    if isinstance(body, CompletionBody) and body.best_of is not None:
        kw["best_of"] = body.best_of
    if body.logit_bias:
        kw["logit_bias"] = logit_bias_ids(body.logit_bias)
    if body.allowed_token_ids is not None:
        kw["allowed_token_ids"] = tuple(body.allowed_token_ids)
    if body.bad_words:  # vLLM's default is []: no words
        kw["bad_words"] = tuple(body.bad_words)

    logprobs_field = "logprobs"
    prompt: str | list[int] | list[ChatMessage] | ChatPrompt
    prompts: tuple[str | list[int], ...] = ()
    echo: str | list[int] | None = None
    is_echo_only = False
    if body.prompt_logprobs is not None:
        kw["prompt_logprobs"] = body.prompt_logprobs
    embeds: tuple[str, ...] = ()
    if isinstance(body, CompletionBody):
        embeds = _embeds_prompts(body)
        prompts = () if body.prompt is None else _completion_prompts(body.prompt)
        prompt = prompts[0] if prompts else ""
        echo = prompts[0] if body.echo else None
        if body.echo and requested == 0:
            # vLLM's: the prompt alone; the engine runs one token that is not shown
            kw["max_tokens"], is_echo_only = 1, True
        if body.logprobs is not None:
            kw["logprobs"] = body.logprobs
            if body.echo and body.prompt_logprobs is None:
                kw["prompt_logprobs"] = body.logprobs  # vLLM's: echo scores the prompt
    else:
        prompt = messages = chat_messages(body.messages)
        if body.top_logprobs is not None and not body.logprobs:
            raise invalid("top_logprobs", "top_logprobs needs logprobs: true")
        if body.logprobs:
            kw["logprobs"] = body.top_logprobs or 0
            logprobs_field = "top_logprobs" if body.top_logprobs is not None else "logprobs"

    kw["structured_outputs"], client_fields = structured_outputs(body)
    if body.prompt_logprobs is None and "prompt_logprobs" in kw:
        client_fields = {**client_fields, "prompt_logprobs": "logprobs"}
    tools = None
    if isinstance(body, ChatBody):
        tools = tool_plan(
            body.tools, body.tool_choice, body.parallel_tool_calls, tool_parser=tool_parser
        )
        if tools is not None:
            if kw["n"] > 1:
                raise invalid("n", "n > 1 with tool calls is not supported")
            if kw["structured_outputs"] is not None:
                field = next(iter(client_fields.values()))
                raise invalid(field, "structured output and tool calls cannot be combined")
            if tools.spec is not None:
                kw["structured_outputs"] = tools.spec
                client_fields = {"structured_outputs.json": "tools", "structured_outputs": "tools"}
        prompt = _chat_prompt(body, messages)
        if body.echo:
            if tools is not None:
                raise invalid("echo", "echo cannot be combined with tool calls")
            echo = _chat_echo(body, messages)
    if body.return_token_ids:
        _check_token_ids(body, tools)
        kw["return_prompt_token_ids"] = True
    if not body.use_beam_search:  # beams sample nothing: a default penalty would refuse them
        kw = defaults.fill(kw)
    params = SamplingParams(**kw)
    try:
        params.check()
    except ParamError as exc:
        renamed = {"max_tokens": max_tokens_field, "logprobs": logprobs_field, **client_fields}
        raise invalid(renamed.get(exc.field, exc.field), str(exc)) from None

    if body.stream and body.prompt_logprobs:
        raise invalid(
            "prompt_logprobs",
            "prompt_logprobs cannot be streamed (as in vLLM): leave stream off (completions' "
            "echo with logprobs does stream the prompt's logprobs)",
        )
    options = body.stream_options
    if options is not None and not body.stream:
        raise invalid("stream_options", "stream_options needs stream: true")
    continuous = bool(options and options.continuous_usage_stats)
    if continuous and not (options and options.include_usage):
        raise invalid(
            "stream_options.continuous_usage_stats",
            "continuous_usage_stats needs include_usage: true",
        )
    if continuous and len(prompts) + len(embeds) > 1:
        raise invalid(
            "stream_options.continuous_usage_stats",
            "continuous_usage_stats needs a single prompt (its chunks count one prompt's tokens)",
        )
    beam = beam_params(
        body,
        params,
        tools=tools,
        client_fields=client_fields,
        max_tokens_field=max_tokens_field,
        is_echo_only=is_echo_only,
    )
    return OpenAIRequest(
        kind=kind,
        model=body.model,
        prompt=prompt,
        params=params,
        stream=bool(body.stream),
        include_usage=bool(options and options.include_usage),
        continuous_usage=continuous,
        echo=echo,
        is_echo_only=is_echo_only,
        user=body.user,
        client_fields={**client_fields, "max_tokens": max_tokens_field},
        tools=tools,
        prompts=prompts,
        beam=beam,
        tokens_as_ids=body.return_tokens_as_token_ids,
        prompt_embeds=embeds,
        return_token_ids=bool(body.return_token_ids),
        request_id=body.request_id,
        include_reasoning=not isinstance(body, ChatBody) or body.include_reasoning,
    )


def _check_token_ids(body: CompletionBody | ChatBody, tools: ToolPlan | None) -> None:
    """return_token_ids' combinations not served: a 400 naming it."""
    why = None
    if body.use_beam_search:
        why = "use_beam_search"
    elif isinstance(body, CompletionBody) and body.echo:
        why = "echo (the prompt's ids are prompt_token_ids)"
    elif tools is not None and body.stream:
        why = "streamed tool calls"
    if why is not None:
        raise invalid("return_token_ids", f"return_token_ids cannot be combined with {why}")


def _chat_prompt(body: ChatBody, messages: list[ChatMessage]) -> list[ChatMessage] | ChatPrompt:
    """The messages, or a ChatPrompt when the template gets options. The tools the request
    declares reach the template whatever tool_choice says, as in vLLM (its default: "none"
    too), so every turn of an agent loop renders the same system prompt; as there,
    chat_template_kwargs may override them, and `documents` too."""
    template_kwargs: dict[str, Any] = {}
    if body.tools:
        template_kwargs["tools"] = [as_sent(tool) for tool in body.tools]
    if body.documents is not None:
        template_kwargs["documents"] = body.documents
    if body.reasoning_effort is not None:
        template_kwargs["reasoning_effort"] = body.reasoning_effort
    template_kwargs.update(body.chat_template_kwargs or {})
    return chat_prompt(
        messages, body.add_generation_prompt, body.continue_final_message, template_kwargs
    )


def chat_prompt(
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    continue_final_message: bool,
    template_kwargs: dict[str, Any] | None,
) -> list[ChatMessage] | ChatPrompt:
    """The messages, or a ChatPrompt when the template gets options other than the defaults
    (their checks are the engine edge's, request_input, which name the field); the HTTP chat
    endpoint's and the websocket's."""
    if add_generation_prompt and not continue_final_message and not template_kwargs:
        return messages
    return ChatPrompt(
        messages=tuple(messages),
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        template_kwargs=template_kwargs or None,
    )


def logit_bias_ids(raw: dict[str, float], field: str = "logit_bias") -> dict[int, float]:
    """OpenAI's token-id strings -> ints (ranges: SamplingParams.check); a 400 names `field`."""
    out = {}
    for key, bias in raw.items():
        if not key.isascii() or not key.isdigit() or len(key) > 10:
            raise invalid(field, f"logit_bias keys must be token ids, got {key!r}")
        out[int(key)] = bias
    return out


def _refuse_unsupported(body: CompletionBody | ChatBody) -> None:
    """OpenAI fields troupe does not serve yet: only their neutral value is accepted."""
    n = 1 if body.n is None else body.n
    if isinstance(body, CompletionBody):
        if body.best_of is not None and body.best_of < n:
            raise invalid("best_of", f"best_of must be >= n ({n}), got {body.best_of}")
        if body.best_of is not None and body.best_of > n and body.stream:
            raise invalid("best_of", "best_of > n cannot stream: the best are known at the end")
        if body.suffix:
            raise invalid("suffix", "suffix is not supported: leave it out")
        return


def _embeds_prompts(body: CompletionBody) -> tuple[str, ...]:
    """The body's prompt_embeds entries; what they cannot go with refused by name (vLLM
    refuses echo and the prompt's logprobs there too: the rows have no tokens to show)."""
    if body.prompt_embeds is None:
        if body.prompt is None:
            raise invalid("prompt", "one of prompt or prompt_embeds is required")
        return ()
    embeds = (body.prompt_embeds,) if isinstance(body.prompt_embeds, str) else body.prompt_embeds
    if not embeds:
        raise invalid("prompt_embeds", "prompt_embeds must not be an empty list")
    refused = (
        ("echo", bool(body.echo), "there is no prompt text to echo"),
        ("prompt_logprobs", body.prompt_logprobs is not None, "its rows have no token ids"),
        ("use_beam_search", body.use_beam_search, "beam search runs token-id prompts"),
    )
    for field, is_set, why in refused:
        if is_set:
            raise invalid(field, f"{field} cannot be used with prompt_embeds: {why}")
    return tuple(embeds)


def _completion_prompts(prompt: str | list[str | int | list[int]]) -> tuple[str | list[int], ...]:
    """A text, a list of token ids, or a list of those (a batch of prompts)."""
    if isinstance(prompt, str):
        return (prompt,)
    kinds = set(map(type, prompt))  # one C-speed pass: prompts run to thousands of ids
    if kinds == {int}:  # msgspec decoded it: ints only, and never bools
        return (cast(list[int], prompt),)
    if prompt and int not in kinds:
        return tuple(p for p in prompt if not isinstance(p, int))
    raise invalid(
        "prompt",
        "'prompt' must be a string, a list of token ids, or a non-empty list of strings or of "
        "token-id lists",
    )


def _chat_echo(body: ChatBody, messages: list[ChatMessage]) -> str:
    """vLLM's chat echo: the last message's content, where its role is the answer's (the
    assistant's, or with add_generation_prompt off the last message's own); else nothing."""
    last = messages[-1]
    role = "assistant" if body.add_generation_prompt else last.role
    return (last.content or "") if last.role == role else ""
