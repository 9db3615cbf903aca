"""vLLM's `use_beam_search` over HTTP, on the fake runner behind a real server (the engine in
its child process, as `troupe serve` runs it). The expected beams are `beam_search` over the
same engine in Python (actors/beam_search.py), so a dropped parameter, a shifted choice or a
wrong prompt fails; the fake model's logprobs are made up but deterministic. Also: what beam
search refuses, each by its field."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest
from troupe.actors.beam_search import Beam, BeamSearchParams, beam_search
from troupe.gateway.openai_requests import parse_request
from troupe.gpu.fake_model import fake_logprob
from troupe.gpu.fake_runner import FakeRunner
from troupe.messages import SamplingParams

from tests.gateway.conftest import ServerThread

PROMPT = "Beams over a made-up model"
MESSAGES = [{"role": "user", "content": "Tell me about beams"}]


def _post(server: ServerThread, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST JSON; (status, JSON body, or the SSE text of a stream)."""
    data = json.dumps({"model": server.engine.model_name, **body}).encode()
    request = urllib.request.Request(
        f"{server.url}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
            return response.status, text if body.get("stream") else json.loads(text)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _beams(server: ServerThread, ids: list[int], **params: Any) -> list[Beam]:
    """The search in Python, over the server's own engine (its RemoteEngine)."""
    beams: list[Beam] = server.call(beam_search(server.engine, ids, BeamSearchParams(**params)))
    return beams


def _texts(out: dict[str, Any], kind: str = "completion") -> list[tuple[int, str, str]]:
    if kind == "chat":
        return [(c["index"], c["message"]["content"], c["finish_reason"]) for c in out["choices"]]
    return [(c["index"], c["text"], c["finish_reason"]) for c in out["choices"]]


def _expected(beams: list[Beam], first: int = 0) -> list[tuple[int, str, str]]:
    return [(first + i, b.text, b.finish_reason) for i, b in enumerate(beams)]


def test_the_engine_process_tells_the_gateway_its_eos_ids(server: ServerThread) -> None:
    eos = server.engine.tokenizer.eos_token_id
    assert eos is not None and server.engine.eos_token_ids == (eos,)


def test_completion_beams_are_the_python_search(server: ServerThread) -> None:
    body = {"prompt": PROMPT, "use_beam_search": True, "n": 3, "max_tokens": 5}
    status, out = _post(server, "/v1/completions", body)
    assert status == 200, out
    ids = server.engine.tokenizer.encode(PROMPT, True)
    beams = _beams(server, ids, beam_width=3, max_tokens=5)
    assert _texts(out) == _expected(beams)
    assert len({text for _, text, _ in _texts(out)}) == 3  # three different beams
    assert all(c["stop_reason"] is None for c in out["choices"])
    assert out["usage"]["prompt_tokens"] == len(ids)  # the prompt once
    assert out["usage"]["completion_tokens"] == 15
    # echo leads each beam with the prompt; token-id prompts run as sent
    status, echoed = _post(server, "/v1/completions", {**body, "echo": True})
    assert status == 200 and _texts(echoed) == [(i, PROMPT + t, f) for i, t, f in _expected(beams)]
    status, by_ids = _post(server, "/v1/completions", {**body, "prompt": ids})
    assert status == 200 and _texts(by_ids) == _expected(beams)
    server.wait_idle()


def test_a_list_of_prompts_numbers_beams_prompt_major(server: ServerThread) -> None:
    prompts = [PROMPT, "Another prompt, other beams"]
    body = {"prompt": prompts, "use_beam_search": True, "n": 2, "max_tokens": 3}
    status, out = _post(server, "/v1/completions", body)
    assert status == 200, out
    ids = [server.engine.tokenizer.encode(p, True) for p in prompts]
    first, second = (_beams(server, i, beam_width=2, max_tokens=3) for i in ids)
    assert _texts(out) == _expected(first) + _expected(second, first=2)
    assert out["usage"]["prompt_tokens"] == len(ids[0]) + len(ids[1])
    assert out["usage"]["completion_tokens"] == 12


def _prompt_offering_eos(width: int) -> list[int]:
    """A token-id prompt whose first round offers EOS among its 2 x width candidates (the fake
    model's top tokens follow the sampled one), so one beam ends at once."""
    eos = 2  # the default model's EOS (checked by the first test)
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=2 * width, ignore_eos=True)
    for first in range(100, 1_000_000):
        prompt = [first, 17, 3, 99]
        (token,) = FakeRunner.reference_tokens(prompt, 1, params)
        entry = fake_logprob(token, 2 * width)
        assert entry is not None
        if any(t == eos for t, _ in entry.top[:5]):  # a high place: it makes the final n
            return prompt
    raise AssertionError("no prompt offers EOS")


def test_length_penalty_eos_and_usage(server: ServerThread) -> None:
    assert server.engine.eos_token_ids == (2,)
    prompt = _prompt_offering_eos(4)
    body = {"prompt": prompt, "use_beam_search": True, "n": 4, "max_tokens": 8}
    answers = {}
    for penalty in (0.0, 1.0):
        status, out = _post(server, "/v1/completions", {**body, "length_penalty": penalty})
        assert status == 200, out
        beams = _beams(server, prompt, beam_width=4, max_tokens=8, length_penalty=penalty)
        assert _texts(out) == _expected(beams)
        answers[penalty] = out
    # ranked by raw logprob the EOS beam (one token) comes first; by logprob per token, not
    assert answers[0.0]["choices"][0]["finish_reason"] == "stop"
    assert answers[0.0]["choices"][0]["stop_reason"] == 2
    assert _texts(answers[0.0]) != _texts(answers[1.0])
    # usage: the EOS is a token of the beam only with include_stop_str_in_output (vLLM's)
    assert answers[0.0]["usage"]["completion_tokens"] == 3 * 8
    status, out = _post(
        server,
        "/v1/completions",
        {**body, "length_penalty": 0.0, "include_stop_str_in_output": True},
    )
    assert status == 200 and _texts(out) == _texts(answers[0.0])
    assert out["usage"]["completion_tokens"] == 3 * 8 + 1


def test_chat_beams_whole_and_streamed_at_the_end(server: ServerThread) -> None:
    body = {"messages": MESSAGES, "use_beam_search": True, "n": 2, "max_tokens": 4}
    status, out = _post(server, "/v1/chat/completions", body)
    assert status == 200, out
    tokenizer = server.engine.tokenizer
    ids = tokenizer.encode(tokenizer.render_chat(MESSAGES, add_generation_prompt=True), False)
    beams = _beams(server, ids, beam_width=2, max_tokens=4)
    assert _texts(out, "chat") == _expected(beams)
    assert out["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": 8,
        "total_tokens": len(ids) + 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    status, sse = _post(server, "/v1/chat/completions", stream)
    assert status == 200
    frames = [f.removeprefix("data: ") for f in sse.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    roles = [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in chunks[:2]]
    assert roles == [(i, {"role": "assistant", "content": ""}) for i in (0, 1)]
    got = [
        (
            c["choices"][0]["index"],
            c["choices"][0]["delta"]["content"],
            c["choices"][0]["finish_reason"],
        )
        for c in chunks[2:4]
    ]
    assert got == _expected(beams)
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] == 8
    server.wait_idle()


@pytest.mark.parametrize(
    "path, extra, field",
    [
        ("/v1/completions", {"stream": True}, "stream"),
        ("/v1/completions", {"logprobs": 1}, "logprobs"),
        ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
        ("/v1/completions", {"best_of": 4}, "best_of"),
        ("/v1/completions", {"guided_regex": "[a-z]+"}, "guided_regex"),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("/v1/completions", {"stop": ["x"]}, "stop"),
        ("/v1/completions", {"logit_bias": {"5": 1.0}}, "logit_bias"),
        ("/v1/completions", {"min_tokens": 2}, "min_tokens"),
        ("/v1/completions", {"repetition_penalty": 1.2}, "repetition_penalty"),
        ("/v1/completions", {"prompt_logprobs": 1}, "prompt_logprobs"),
        ("/v1/completions", {"echo": True, "max_tokens": 0}, "max_tokens"),
        (
            "/v1/chat/completions",
            {
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
            "stream_options.continuous_usage_stats",
        ),
        (
            "/v1/chat/completions",
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": "required",
                "n": 1,
            },
            "tools",
        ),
    ],
)
def test_what_beam_search_refuses_is_named(
    server: ServerThread, path: str, extra: dict[str, Any], field: str
) -> None:
    prompt = {"messages": MESSAGES} if "chat" in path else {"prompt": PROMPT}
    body = {**prompt, "use_beam_search": True, "n": 2, "max_tokens": 3, **extra}
    status, out = _post(server, path, body)
    assert status == 400, out
    assert out["error"]["param"] == field, out
    # the same body without beam search is a valid request (parsed only: a grammar run on the
    # shared server would change the executor's counts test_engine_view reads)
    kind = "chat" if "chat" in path else "completion"
    raw = json.dumps({**body, "use_beam_search": False}).encode()
    assert parse_request(kind, raw, default_max_tokens=16).beam is None


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ({"n": 11}, "n", "n must be in [1, 10]"),
        ({"n": 0}, "n", "n must be >= 1"),
        ({"length_penalty": 100.0}, "length_penalty", "[-10, 10]"),
        ({"use_beam_search": False, "length_penalty": 0.5}, "length_penalty", "use_beam_search"),
    ],
)
def test_bad_values_name_the_field_and_limit(
    server: ServerThread, extra: dict[str, Any], field: str, words: str
) -> None:
    body = {"prompt": PROMPT, "use_beam_search": True, "max_tokens": 3, **extra}
    status, out = _post(server, "/v1/completions", body)
    assert status == 400, out
    assert out["error"]["param"] == field and words in out["error"]["message"], out


def test_prompts_the_engine_refuses(server: ServerThread) -> None:
    too_long = [7] * server.engine.max_model_len
    body = {"prompt": too_long, "use_beam_search": True, "n": 2, "max_tokens": 3}
    status, out = _post(server, "/v1/completions", body)
    assert status == 400 and out["error"]["code"] == "context_length_exceeded", out
    assert out["error"]["param"] == "prompt"
    vocab = server.engine.tokenizer.vocab_size
    status, out = _post(server, "/v1/completions", {**body, "prompt": [[5, 6], [5, vocab]]})
    assert status == 400 and out["error"]["param"] == "prompt[1]", out
    server.wait_idle()  # the other prompt's search was aborted


@pytest.mark.anyio
async def test_a_vanished_client_ends_the_search(server: ServerThread) -> None:
    body = {
        "model": server.engine.model_name,
        "prompt": PROMPT,
        "use_beam_search": True,
        "n": 4,
        "max_tokens": 4000,  # rounds for far longer than the test waits
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession() as http:
        with contextlib.suppress(TimeoutError):
            timeout = aiohttp.ClientTimeout(total=0.5)
            await http.post(f"{server.url}/v1/completions", json=body, timeout=timeout)
    deadline = time.monotonic() + 5
    while server.gateway.num_streams:  # the handler was cancelled, its search with it
        assert time.monotonic() < deadline, "the search went on without its client"
        await asyncio.sleep(0.02)
    await asyncio.to_thread(server.wait_idle)
    for _ in range(10):  # and no round starts after it
        assert server.engine.num_active == 0
        await asyncio.sleep(0.02)
