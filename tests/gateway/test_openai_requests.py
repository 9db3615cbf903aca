"""parse_request: OpenAI bodies -> prompt + SamplingParams, or a 400 naming the field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from troupe.actors.core.chat_template import ChatTemplate
from troupe.gateway.errors import ApiError
from troupe.gateway.openai_requests import Kind, OpenAIRequest
from troupe.gateway.openai_requests import parse_request as parse_raw
from troupe.messages import ChatMessage, ChatPrompt, SamplingParams


def parse_request(kind: Kind, body: Any, *, default_max_tokens: int) -> OpenAIRequest:
    return parse_raw(kind, msgspec.json.encode(body), default_max_tokens=default_max_tokens)


def _bad(kind: Kind, body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_request(kind, body, default_max_tokens=16)
    assert info.value.status == 400
    return info.value


def test_completion_fields_map_to_sampling_params() -> None:
    req = parse_request(
        "completion",
        {
            "model": "m",
            "prompt": ["Hello"],
            "max_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "min_p": 0.1,
            "seed": 11,
            "stop": "\n",
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "logprobs": 2,
            "n": 1,
            "ignore_eos": True,
            "stop_token_ids": [5, 6],
            "repetition_penalty": 1.2,
            "priority": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        default_max_tokens=16,
    )
    assert req.prompt == "Hello" and req.prompts == ("Hello",)
    assert req.model == "m"
    assert req.stream and req.include_usage
    assert req.params == SamplingParams(
        max_tokens=7,
        strict_max_tokens=True,
        temperature=0,
        top_p=0.5,
        top_k=3,
        min_p=0.1,
        seed=11,
        stop=("\n",),
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logprobs=2,
        ignore_eos=True,
        stop_token_ids=(5, 6),
        repetition_penalty=1.2,
        priority=4,
    )


def test_chat_messages_parts_and_logprobs() -> None:
    req = parse_request(
        "chat",
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
                },
            ],
            "max_completion_tokens": 9,
            "logprobs": True,
            "top_logprobs": 3,
            "stop": ["a", "b"],
        },
        default_max_tokens=1024,
    )
    assert req.prompt == [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Hi \nthere"),  # vLLM joins parts a line apart
    ]
    assert (req.params.max_tokens, req.params.logprobs, req.params.stop) == (9, 3, ("a", "b"))
    assert not req.stream


def test_defaults_and_token_id_prompt() -> None:
    req = parse_request("completion", {"prompt": [1, 2, 3]}, default_max_tokens=16)
    assert req.prompt == [1, 2, 3]
    assert req.params == SamplingParams(max_tokens=16)
    chat = parse_request(
        "chat", {"messages": [{"role": "user", "content": "x"}]}, default_max_tokens=900
    )
    assert chat.params.max_tokens == 900 and chat.params.logprobs is None
    # a default clips at max_model_len; a named max_tokens must fit (admission's 400)
    assert not req.params.strict_max_tokens and not chat.params.strict_max_tokens
    named = parse_request("completion", {"prompt": "x", "max_tokens": 5}, default_max_tokens=16)
    assert named.params.strict_max_tokens


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        ("completion", {"prompt": "x", "n": 0}, "n"),
        ("completion", {"prompt": "x", "n": 2, "best_of": 1}, "best_of"),
        ("completion", {"prompt": "x", "best_of": 2, "stream": True}, "best_of"),
        ("completion", {"prompt": "x", "temperature": "hot"}, "temperature"),
        ("completion", {"prompt": "x", "temperature": -1}, "temperature"),
        ("completion", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("completion", {"prompt": "x", "max_tokens": True}, "max_tokens"),
        ("completion", {"prompt": "x", "top_p": 1.5}, "top_p"),
        ("completion", {"prompt": "x", "stop": [1]}, "stop[0]"),
        ("completion", {"prompt": "x", "logprobs": 99}, "logprobs"),
        ("completion", {"prompt": "x", "frobnicate": 1}, "frobnicate"),
        ("completion", {"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
        ("completion", {"prompt": "x", "prompt_logprobs": -1}, "prompt_logprobs"),
        ("completion", {"prompt": "x", "prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),
        ("completion", {"prompt": "x", "echo": True, "logprobs": 21}, "logprobs"),
        ("completion", {"prompt": "x", "suffix": "y"}, "suffix"),
        ("completion", {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
        ("completion", {"prompt": "x", "logit_bias": {"-5": 1}}, "logit_bias"),
        ("completion", {"prompt": "x", "logit_bias": {"5": 100.5}}, "logit_bias"),
        ("completion", {"prompt": "x", "logit_bias": {"5": "up"}}, "logit_bias"),
        ("completion", {"prompt": "x", "min_tokens": 17}, "min_tokens"),
        ("completion", {"prompt": "x", "min_tokens": -1}, "min_tokens"),
        (
            "completion",
            {"prompt": "x", "min_tokens": 2, "response_format": {"type": "json_object"}},
            "min_tokens",
        ),
        (
            "completion",
            {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
        ),
        ("completion", {"prompt": ["a", 5]}, "prompt"),
        ("completion", {"prompt": []}, "prompt"),
        (
            "completion",
            {
                "prompt": ["a", "b"],
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
            "stream_options.continuous_usage_stats",
        ),
        ("completion", {}, "prompt"),
        (
            "completion",
            {"prompt": "x", "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        ("chat", {"messages": []}, "messages"),
        ("chat", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].image_url",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "messages[0].content[0].type",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}]}]},
            "messages[0].content[0].image_url.url",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3},
            "max_completion_tokens",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 50},
            "top_logprobs",
        ),
        ("chat", [1, 2], "body"),
    ],
)
def test_bad_fields_are_named(kind: Kind, body: Any, param: str) -> None:
    error = _bad(kind, body)
    assert error.param == param
    assert error.body()["error"]["param"] == param
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_n_and_best_of_messages_are_clear() -> None:
    assert _bad("completion", {"prompt": "x", "n": 0}).message == "n must be >= 1, got 0"
    error = _bad("completion", {"prompt": "x", "n": 3, "best_of": 2})
    assert error.message == "best_of must be >= n (3), got 2"


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_cache_salt_reaches_the_params_and_is_checked(kind: Kind) -> None:
    user = {"role": "user", "content": "x"}
    body: dict[str, Any] = {"prompt": "x"} if kind == "completion" else {"messages": [user]}
    plain = parse_request(kind, body, default_max_tokens=16).params
    assert plain.cache_salt is None
    salted = parse_request(kind, {**body, "cache_salt": "tenant-7"}, default_max_tokens=16).params
    assert salted.cache_salt == "tenant-7"
    assert salted.cache_namespace != plain.cache_namespace
    empty = _bad(kind, {**body, "cache_salt": ""})
    assert empty.param == "cache_salt" and "1 to 256 characters" in empty.message
    assert _bad(kind, {**body, "cache_salt": "s" * 257}).param == "cache_salt"
    typed = _bad(kind, {**body, "cache_salt": 7})
    assert typed.param == "cache_salt" and "Expected `str" in typed.message


def test_with_lora_sets_the_adapter_on_the_params_and_the_beams() -> None:
    body = {"prompt": "x", "n": 2, "use_beam_search": True, "cache_salt": "s"}
    req = parse_request("completion", body, default_max_tokens=16)
    assert req.with_lora(None) is req
    on = req.with_lora("sql")
    assert on.params.lora == "sql" and on.params.cache_salt == "s"
    assert on.beam is not None and (on.beam.lora, on.beam.cache_salt) == ("sql", "s")
    assert req.params.lora is None  # the request it came from is left as it was
    plain = parse_request("completion", {"prompt": "x"}, default_max_tokens=16).with_lora("a")
    assert plain.beam is None and plain.params.lora == "a"


def test_extras_map_to_sampling_params() -> None:
    req = parse_request(
        "completion",
        {
            "prompt": [5, 6],
            "echo": True,
            "logit_bias": {"7": -100, "42": 2.5},
            "min_tokens": 3,
            "seed": 9,
            "user": "someone",
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
        default_max_tokens=16,
    )
    assert req.params.logit_bias == {7: -100.0, 42: 2.5}
    assert req.params.min_tokens == 3 and req.params.seed == 9
    assert req.echo == [5, 6] and req.include_usage and req.continuous_usage
    chat = parse_request(
        "chat",
        {"messages": [{"role": "user", "content": "x"}], "logit_bias": {"3": 1}, "min_tokens": 1},
        default_max_tokens=16,
    )
    assert chat.params.logit_bias == {3: 1.0} and chat.params.min_tokens == 1
    assert chat.echo is None and not chat.continuous_usage


def test_prompt_logprobs_map_to_sampling_params() -> None:
    """vLLM's rules: echo with logprobs scores the prompt with the same k (an explicit
    prompt_logprobs wins); echo with max_tokens 0 runs one token to show the prompt alone."""
    echo = parse_request(
        "completion",
        {"prompt": "x", "echo": True, "logprobs": 3, "max_tokens": 1},
        default_max_tokens=16,
    )
    assert echo.params.prompt_logprobs == 3 and echo.params.logprobs == 3
    assert echo.client_fields["prompt_logprobs"] == "logprobs"  # an engine rejection names it
    assert not echo.is_echo_only
    explicit = parse_request(
        "completion",
        {"prompt": "x", "echo": True, "logprobs": 3, "prompt_logprobs": 1},
        default_max_tokens=16,
    )
    assert explicit.params.prompt_logprobs == 1 and "prompt_logprobs" not in explicit.client_fields
    plain = parse_request("completion", {"prompt": "x", "logprobs": 3}, default_max_tokens=16)
    assert plain.params.prompt_logprobs is None
    only = parse_request(
        "completion", {"prompt": "x", "echo": True, "max_tokens": 0}, default_max_tokens=16
    )
    assert only.is_echo_only and only.params.max_tokens == 1
    chat = parse_request(
        "chat",
        {"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 0},
        default_max_tokens=16,
    )
    assert chat.params.prompt_logprobs == 0
    # vLLM lets 0 stream (nothing is streamed back)
    streamed = {"prompt": "x", "prompt_logprobs": 0, "stream": True}
    assert parse_request("completion", streamed, default_max_tokens=16).params.prompt_logprobs == 0
    bad = _bad("chat", {"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 21})
    assert bad.param == "prompt_logprobs" and "[0, 20]" in bad.message


def test_streaming_fields_pass_through() -> None:
    """StreamingLLM's fields reach SamplingParams; a negative window is a 400 naming it."""
    body = {"prompt": "hi", "streaming_window": 1020, "sink_tokens": 4}
    params = parse_request("completion", body, default_max_tokens=16).params
    assert (params.streaming_window, params.sink_tokens) == (1020, 4)
    assert "streaming_window" in str(_bad("completion", {"prompt": "hi", "streaming_window": -1}))


def test_completion_prompt_lists() -> None:
    """A batch of prompts (texts and token-id lists, mixed): every one, in order."""
    req = parse_request("completion", {"prompt": ["a", [1, 2], "b"]}, default_max_tokens=16)
    assert req.prompts == ("a", [1, 2], "b") and req.prompt == "a"
    ids = parse_request("completion", {"prompt": [3, 4]}, default_max_tokens=16)
    assert ids.prompts == ([3, 4],)
    chat = parse_request(
        "chat", {"messages": [{"role": "user", "content": "x"}]}, default_max_tokens=16
    )
    assert chat.prompts == ()


def test_documents_reach_the_template_under_chat_template_kwargs() -> None:
    """vLLM's `documents` (RAG templates) is a template variable; chat_template_kwargs wins."""
    docs = [{"title": "Primes", "text": "2 is the smallest prime."}]
    messages = [{"role": "user", "content": "Smallest prime?"}]
    req = parse_request("chat", {"messages": messages, "documents": docs}, default_max_tokens=9)
    assert isinstance(req.prompt, ChatPrompt) and req.prompt.template_kwargs == {"documents": docs}
    template = ChatTemplate(
        "{% for d in documents %}[{{ d.title }}] {{ d.text }}\n{% endfor %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    )
    rendered = template.render(messages, **req.prompt.template_kwargs)
    assert rendered == "[Primes] 2 is the smallest prime.\nuser: Smallest prime?\n"
    both = {"messages": messages, "documents": docs, "chat_template_kwargs": {"documents": []}}
    req = parse_request("chat", both, default_max_tokens=9)
    assert isinstance(req.prompt, ChatPrompt) and req.prompt.template_kwargs == {"documents": []}
