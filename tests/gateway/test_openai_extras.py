"""The extras clients send, through the official `openai` client against the fake-runner
gateway: min_tokens, echo, stream_options (include_usage, continuous_usage_stats), cached
tokens, seed and user; suffix and the other refusals name their field; /tokenize and
/detokenize in vLLM's shapes, behind the API key."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest
from openai import OpenAI
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import EOS_SEED_BASE


@pytest.fixture(scope="module")
def client(server) -> OpenAI:  # type: ignore[no-untyped-def]
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """POST JSON; (status, decoded JSON body), error statuses included."""
    data = json.dumps(body).encode()
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url, data=data, headers=all_headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _bad_request(call: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    return info.value


def _param(error: openai.BadRequestError) -> str:
    body = error.body
    assert isinstance(body, dict)
    return str(body.get("param"))


def test_min_tokens_holds_back_eos(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    """The fake model's first token is EOS under this seed: min_tokens defers it."""
    model = server.engine.model_name
    seed = EOS_SEED_BASE + 1
    plain = client.completions.create(model=model, prompt="Hi", max_tokens=6, seed=seed)
    assert plain.choices[0].finish_reason == "stop"
    assert plain.usage is not None and plain.usage.completion_tokens == 1
    held = client.completions.create(
        model=model, prompt="Hi", max_tokens=6, seed=seed, extra_body={"min_tokens": 4}
    )
    assert held.choices[0].finish_reason == "length"
    assert held.usage is not None and held.usage.completion_tokens == 6
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=5,
        seed=seed,
        extra_body={"min_tokens": 5},
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 5


def test_echo_leads_with_the_prompt(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    prompt = "Echo me, please"
    base = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0, echo=True
    )
    assert out.choices[0].text == prompt + base.choices[0].text
    chunks = list(
        client.completions.create(
            model=model, prompt=prompt, max_tokens=4, temperature=0, echo=True, stream=True
        )
    )
    assert chunks[0].choices[0].text == prompt
    assert "".join(c.choices[0].text for c in chunks) == prompt + base.choices[0].text
    ids = server.engine.tokenizer.encode("token ids", False)
    by_ids = client.completions.create(
        model=model, prompt=ids, max_tokens=2, temperature=0, echo=True
    )
    assert by_ids.choices[0].text.startswith("token ids")
    for bad in ([-1], [10**12]):
        error = _bad_request(
            lambda bad=bad: client.completions.create(  # type: ignore[misc]
                model=model, prompt=bad, max_tokens=2, echo=True
            )
        )
        assert _param(error) == "prompt"


def test_continuous_usage_on_every_chunk(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    for stream in (
        client.completions.create(
            model=model,
            prompt="Count with me",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
            extra_body={"ignore_eos": True},
        ),
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Count with me"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
            extra_body={"ignore_eos": True},
        ),
    ):
        chunks = list(stream)
        final = chunks[-1].usage
        assert chunks[-1].choices == [] and final is not None
        assert final.completion_tokens == 5 and final.prompt_tokens > 0
        counts = []
        for chunk in chunks:
            assert chunk.usage is not None, chunk
            assert chunk.usage.prompt_tokens == final.prompt_tokens
            assert chunk.usage.total_tokens == final.prompt_tokens + chunk.usage.completion_tokens
            counts.append(chunk.usage.completion_tokens)
        assert counts == sorted(counts) and counts[-1] == 5


def test_include_usage_alone_keeps_chunks_bare(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    chunks = list(
        client.completions.create(
            model=server.engine.model_name,
            prompt="x",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage is not None


def test_force_include_usage_ends_every_stream_with_usage() -> None:
    """--enable-force-include-usage (vLLM's): a usage chunk whether the client asked or not;
    without it, none unless asked."""
    from tests.gateway.conftest import BASE_CONFIG, ServerThread

    forced = ServerThread(BASE_CONFIG, GatewaySettings(enable_force_include_usage=True)).start()
    try:
        client = OpenAI(base_url=f"{forced.url}/v1", api_key="unused", max_retries=0, timeout=30)
        model = forced.engine.model_name
        completion = list(
            client.completions.create(model=model, prompt="x", max_tokens=3, stream=True)
        )
        chat = list(
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True
            )
        )
        for chunks in (completion, chat):
            assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
        whole = client.completions.create(model=model, prompt="x", max_tokens=3)
        assert whole.usage is not None and whole.usage.completion_tokens == 3
    finally:
        forced.shutdown()


def test_no_usage_chunk_unless_asked(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    chunks = list(
        client.completions.create(
            model=server.engine.model_name, prompt="x", max_tokens=3, stream=True
        )
    )
    assert all(c.usage is None for c in chunks) and chunks[-1].choices


def test_cached_tokens_count_prefix_cache_hits(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    model = server.engine.model_name
    prompt = "A long shared preamble that fills several blocks of the cache. " * 6
    first = client.completions.create(model=model, prompt=prompt, max_tokens=2)
    assert first.usage is not None and first.usage.prompt_tokens > 48
    server.wait_idle()
    again = client.completions.create(model=model, prompt=prompt, max_tokens=2)
    usage = again.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= 48 and cached % 16 == 0
    assert cached < usage.prompt_tokens  # the last token is always computed


def test_seed_and_user_are_accepted_and_seed_is_honoured(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    def text(seed: int) -> str:
        out = client.completions.create(
            model=server.engine.model_name,
            prompt="Roll the dice",
            max_tokens=6,
            temperature=1.0,
            seed=seed,
            user="user-1234",
            extra_body={"ignore_eos": True},
        )
        return out.choices[0].text

    assert text(11) == text(11)
    assert text(11) != text(12)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"suffix": "tail"}, "suffix"),
        ({"extra_body": {"prompt_logprobs": 21}}, "prompt_logprobs"),
        ({"stream": True, "extra_body": {"prompt_logprobs": 1}}, "prompt_logprobs"),
        ({"extra_body": {"logit_bias": {"not-a-token": 1}}}, "logit_bias"),
        ({"logit_bias": {"5": 250}}, "logit_bias"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        ({"extra_body": {"min_tokens": 99}}, "min_tokens"),
        (
            {
                "stream": True,
                "stream_options": {"continuous_usage_stats": True},
            },
            "stream_options.continuous_usage_stats",
        ),
    ],
)
def test_refusals_name_their_field(
    client: OpenAI,
    server,  # type: ignore[no-untyped-def]
    kwargs: dict[str, Any],
    param: str,
) -> None:
    error = _bad_request(
        lambda: client.completions.create(
            model=server.engine.model_name, prompt="x", max_tokens=4, **kwargs
        )
    )
    assert _param(error) == param


def test_chat_logit_bias_range_is_named(client: OpenAI, server) -> None:  # type: ignore[no-untyped-def]
    error = _bad_request(
        lambda: client.chat.completions.create(
            model=server.engine.model_name,
            messages=[{"role": "user", "content": "x"}],
            logit_bias={"5": -100.5},
        )
    )
    assert _param(error) == "logit_bias" and "[-100, 100]" in str(error)


def test_tokenize_and_detokenize(server) -> None:  # type: ignore[no-untyped-def]
    tokenizer = server.engine.tokenizer
    text = "The theatre troupe arrived"
    tokenize, detokenize = f"{server.url}/tokenize", f"{server.url}/detokenize"
    status, out = _post(tokenize, {"prompt": text})
    assert status == 200 and out["tokens"] == tokenizer.encode(text, True)
    assert out["count"] == len(out["tokens"])
    assert out["max_model_len"] == server.engine.max_model_len
    assert out["token_strs"] is None
    _, plain = _post(tokenize, {"prompt": text, "add_special_tokens": False})
    assert plain["tokens"] == tokenizer.encode(text, False)
    _, strs = _post(tokenize, {"prompt": text, "return_token_strs": True})
    assert len(strs["token_strs"]) == strs["count"] and strs["token_strs"][1].startswith("Ġ")
    assert "".join(strs["token_strs"]).replace("Ġ", " ") == text  # vLLM's: vocabulary entries

    messages = [{"role": "user", "content": "Hello there"}]
    _, chat = _post(tokenize, {"model": server.engine.model_name, "messages": messages})
    rendered = tokenizer.render_chat(messages, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer.encode(rendered, False)
    _, bare = _post(tokenize, {"messages": messages, "add_generation_prompt": False})
    assert bare["count"] < chat["count"]

    status, back = _post(detokenize, {"tokens": out["tokens"]})
    assert status == 200 and back == {"prompt": tokenizer.decode(out["tokens"], False)}
    assert text in back["prompt"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "x", "add_generation_prompt": False}, "add_generation_prompt"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "y"}]}, "messages[0].role"),
        ("/tokenize", {"prompt": "x", "return_token_strs": 1}, "return_token_strs"),
        ("/detokenize", {"tokens": [1, -2]}, "tokens[1]"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens[1]"),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ],
)
def test_tokenize_errors_name_their_field(server, path: str, body: Any, param: str) -> None:  # type: ignore[no-untyped-def]
    status, out = _post(f"{server.url}{path}", body)
    assert status == 400, out
    assert out["error"]["param"] == param


def test_tokenize_wants_the_api_key(server) -> None:  # type: ignore[no-untyped-def]
    url = server.add_gateway(GatewaySettings(api_key="sesame"))
    for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [5]})):
        assert _post(f"{url}{path}", body)[0] == 401
        assert _post(f"{url}{path}", body, {"Authorization": "Bearer sesame"})[0] == 200
    assert _post(f"{server.url}/tokenize", {"prompt": "x", "model": "other"})[0] == 404


def test_websocket_frames_take_the_extras() -> None:
    from troupe.gateway.ws_requests import FrameError, Generate, parse_frame

    frame = {"type": "generate", "request_id": "r", "prompt": "x", "max_tokens": 4}
    ok = parse_frame(json.dumps({**frame, "logit_bias": {"7": -100}, "min_tokens": 2}))
    assert isinstance(ok, Generate)
    assert ok.params.logit_bias == {7: -100.0} and ok.params.min_tokens == 2
    for extra, field in (
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"min_tokens": 5}, "min_tokens"),
    ):
        bad = parse_frame(json.dumps({**frame, **extra}))
        assert isinstance(bad, FrameError) and bad.field == field, bad
