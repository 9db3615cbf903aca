"""Fuzz every request field and frame type of both endpoints, and the Python API.

Properties, for any input: an HTTP answer is 2xx or 4xx, never 5xx; a websocket frame is
answered with frames of a known type and the socket goes on; Engine.generate yields exactly
one terminal event and raises nothing; nothing hangs (anyio.fail_after, generous, is only a
hang detector); afterwards the engine is idle with no KV block owned (engine.stats()) and
still serves a normal request.

The server is a fake-runner engine with a short max_model_len, so even a valid request with
a huge max_tokens ends within a few hundred steps. Examples are derandomized: CI reruns the
same ones.
"""

from __future__ import annotations

import json
import math
from typing import Any

import aiohttp
import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from troupe.messages import Aborted, Delta, Failed, Finished, Rejected
from websockets.asyncio.client import connect

ServerThread = Any  # conftest's ServerThread (the fixtures hand it over)

HANG = 60.0  # s: a hang detector only; nothing here waits on a clock otherwise
FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- values ------------------------------------------------------------------------------------

EDGE_NUMBERS = st.sampled_from(
    [0, -1, 1, 2, 2**31 - 1, 2**31, -(2**31), 2**63, 2**64, 10**30, 10**400,
     0.0, -0.0, 0.5, 1.5, 1e-300, 1e-40, 1e30, 1e31, 1e308, -1e308]
)  # fmt: skip
JUNK: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | EDGE_NUMBERS | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                   max_size=3),
    max_leaves=6,
)  # fmt: skip


@st.composite
def perturbed(
    draw: st.DrawFn,
    valid: dict[str, st.SearchStrategy[Any]],
    required: tuple[str, ...],
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A valid body (its required fields and some optional ones), then up to two fields set
    to an edge number or junk of any type; `extra` names fields valid bodies leave out."""
    body = {name: draw(valid[name]) for name in required}
    for name in draw(st.lists(st.sampled_from(sorted(valid)), unique=True, max_size=5)):
        body[name] = draw(valid[name])
    names = sorted(valid) + list(extra) + ["frobnicate"]
    for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=2)):
        body[name] = draw(EDGE_NUMBERS | JUNK)
    return body


# Lone surrogates too: json.dumps writes them as escapes, the Python API passes them as is.
TEXT = st.text(max_size=40) | st.text(st.characters(exclude_categories=()), max_size=8)
TOKEN_IDS = st.lists(st.integers(0, 40000), min_size=1, max_size=8)
SAMPLING: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": st.integers(1, 6) | st.just(10**6),  # huge: clipped (websocket), a 400 (HTTP)
    "temperature": st.sampled_from([0.0, 0.7, 1.0]),
    "top_p": st.floats(0.05, 1.0),
    "top_k": st.integers(-1, 50),
    "min_p": st.floats(0.0, 0.5),
    "seed": st.integers(0, 2**63 - 1),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 40000), max_size=3),
    "ignore_eos": st.booleans(),
    "presence_penalty": st.floats(-2.0, 2.0),
    "frequency_penalty": st.floats(-2.0, 2.0),
    "repetition_penalty": st.floats(0.5, 2.0),
    "priority": st.integers(-10, 10),
    "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "min_tokens": st.integers(0, 1),
}
PART = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
MESSAGE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "role": st.sampled_from(["system", "user", "assistant"]),
    "content": TEXT | st.lists(PART, max_size=2),
    "name": TEXT,
}
VALID_MESSAGE = st.fixed_dictionaries(
    {"role": MESSAGE_FIELDS["role"], "content": MESSAGE_FIELDS["content"]},
    optional={"name": TEXT},
)
MESSAGE = st.one_of(
    VALID_MESSAGE, VALID_MESSAGE, VALID_MESSAGE, perturbed(MESSAGE_FIELDS, ("role", "content"))
)
MESSAGES = st.lists(MESSAGE, min_size=1, max_size=3)
COMMON_HTTP: dict[str, st.SearchStrategy[Any]] = {
    **SAMPLING,
    "model": st.just("SmolLM2-135M-Instruct"),
    "stream": st.booleans(),
    "n": st.just(1),
    "logit_bias": st.dictionaries(st.integers(0, 40000).map(str), st.floats(-100, 100), max_size=3),
    "user": TEXT,
}
COMPLETION = perturbed(
    {
        **COMMON_HTTP,
        "prompt": TEXT | TOKEN_IDS | st.lists(TEXT | TOKEN_IDS, min_size=1, max_size=1),
        "logprobs": st.integers(0, 5),
        "echo": st.booleans(),  # with logprobs: the prompt's logprobs lead the answer
        "prompt_logprobs": st.integers(0, 5),
        "best_of": st.just(1),
    },
    required=("prompt",),
    extra=("stream_options", "suffix", "messages"),
)
CHAT = perturbed(
    {
        **COMMON_HTTP,
        "messages": MESSAGES,
        "max_completion_tokens": st.integers(1, 6),
        "response_format": st.just({"type": "text"}),
        "tools": st.just([]),
        "tool_choice": st.just("none"),
        "metadata": st.dictionaries(TEXT, TEXT, max_size=2),
    },
    required=("messages",),
    extra=("stream_options", "logprobs", "top_logprobs", "prompt", "best_of", "prompt_logprobs"),
)


def encode(body: Any, mutation: str) -> bytes:
    """JSON text of `body` (non-finite floats and huge ints written raw), maybe mangled."""
    text = json.dumps(body, allow_nan=True)
    match mutation:
        case "truncate":
            text = text[: len(text) // 2]
        case "deep":
            text = '{"prompt": ' + "[" * 5000 + "]" * 5000 + "}"
        case "garbage":
            text = text.replace('"', "'", 1)
    return text.encode("utf-8", "surrogatepass")


MUTATIONS = st.sampled_from(["none", "none", "none", "truncate", "deep", "garbage"])

# -- helpers -----------------------------------------------------------------------------------


def assert_idle_and_serving(server: ServerThread) -> None:
    """No request in flight, no KV block owned, and a normal request still completes."""
    server.wait_idle(timeout=HANG)
    stats = server.engine.stats()
    assert stats.num_gpu_blocks_used == 0 and stats.num_cpu_blocks_used == 0, stats

    async def normal() -> None:
        with anyio.fail_after(HANG):
            async with aiohttp.ClientSession() as http:
                body = {"prompt": "hello", "max_tokens": 3, "ignore_eos": True}
                async with http.post(f"{server.url}/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["usage"]["completion_tokens"] == 3

    anyio.run(normal)


async def post(server: ServerThread, path: str, data: bytes) -> int:
    async with aiohttp.ClientSession() as http:
        headers = {"Content-Type": "application/json"}
        async with http.post(server.url + path, data=data, headers=headers) as resp:
            if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                lines = [line async for line in resp.content]
                assert lines and lines[-2:] == [b"data: [DONE]\n", b"\n"], lines[-3:]
            else:
                answer = await resp.json()
                assert isinstance(answer, dict)
                if resp.status >= 400:
                    assert set(answer["error"]) == {"message", "type", "param", "code"}
            return resp.status


def check_http(server: ServerThread, path: str, body: Any, mutation: str) -> None:
    async def run() -> int:
        with anyio.fail_after(HANG):
            return await post(server, path, encode(body, mutation))

    status = anyio.run(run)
    assert status < 500 and status in (200, 400, 404, 413, 415, 429), status
    if mutation != "none":
        assert status == 400, status
    server.wait_idle(timeout=HANG)


# -- HTTP --------------------------------------------------------------------------------------


@FUZZ
@given(body=COMPLETION, mutation=MUTATIONS)
def test_fuzz_completions(fuzz_server: ServerThread, body: dict[str, Any], mutation: str) -> None:
    check_http(fuzz_server, "/v1/completions", body, mutation)


@FUZZ
@given(body=CHAT, mutation=MUTATIONS)
def test_fuzz_chat_completions(
    fuzz_server: ServerThread, body: dict[str, Any], mutation: str
) -> None:
    check_http(fuzz_server, "/v1/chat/completions", body, mutation)


def test_after_http_fuzz_the_engine_is_clean(fuzz_server: ServerThread) -> None:
    assert_idle_and_serving(fuzz_server)


# -- websocket ---------------------------------------------------------------------------------

REQUEST_IDS = st.sampled_from(["a", "b", "c"])
GENERATE = st.one_of(
    perturbed(
        {**SAMPLING, "type": st.just("generate"), "request_id": REQUEST_IDS, "prompt": TEXT
         | TOKEN_IDS}, required=("type", "request_id", "prompt"), extra=("messages",)),
    perturbed(
        {**SAMPLING, "type": st.just("generate"), "request_id": REQUEST_IDS,
         "messages": MESSAGES}, required=("type", "request_id", "messages"), extra=("prompt",)),
)  # fmt: skip
CANCEL = perturbed(
    {"type": st.just("cancel"), "request_id": REQUEST_IDS}, required=("type", "request_id")
)
OTHER = st.fixed_dictionaries({"type": JUNK, "request_id": REQUEST_IDS}) | JUNK
FRAME = st.one_of(
    GENERATE.map(json.dumps),
    GENERATE.map(json.dumps),
    CANCEL.map(json.dumps),
    OTHER.map(json.dumps),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.just("[" * 3000 + "]" * 3000),
)


@settings(FUZZ, max_examples=25)
@given(frames=st.lists(FRAME, min_size=1, max_size=6))
def test_fuzz_websocket(fuzz_server: ServerThread, frames: list[str | bytes]) -> None:
    url = fuzz_server.url.replace("http://", "ws://") + "/v1/ws"
    sentinel = {"type": "generate", "request_id": "sentinel", "prompt": "x", "max_tokens": 2}

    async def run() -> None:
        with anyio.fail_after(HANG):
            async with connect(url, max_size=None) as ws:
                for frame in frames:
                    await ws.send(frame)
                await ws.send(json.dumps(sentinel))
                while True:  # every frame is well formed; the socket lives on to the sentinel
                    frame = json.loads(await ws.recv())
                    assert frame["type"] in ("delta", "done", "error"), frame
                    if frame["type"] == "error":
                        assert frame["code"] and frame["message"], frame
                    if frame["request_id"] == "sentinel" and frame["type"] != "delta":
                        assert frame["type"] == "done", frame
                        break

    anyio.run(run)
    fuzz_server.wait_idle(timeout=HANG)  # closing the socket aborted what was left


def test_after_websocket_fuzz_the_engine_is_clean(fuzz_server: ServerThread) -> None:
    assert_idle_and_serving(fuzz_server)


# -- Python API --------------------------------------------------------------------------------

PROMPTS = st.one_of(
    TEXT,
    TOKEN_IDS,
    MESSAGES,
    st.lists(st.integers(-5, 60000) | EDGE_NUMBERS, max_size=4),
    JUNK,
    st.builds(object),
    st.binary(max_size=6),
)
PARAMS = st.one_of(
    st.none(),
    perturbed(SAMPLING, required=()),
    perturbed(SAMPLING, required=()),
    st.dictionaries(st.text(max_size=6), JUNK, max_size=3),
    JUNK,
)


@settings(FUZZ, max_examples=60)
@given(prompt=PROMPTS, params=PARAMS)
def test_fuzz_engine_generate(fuzz_server: ServerThread, prompt: Any, params: Any) -> None:
    engine = fuzz_server.engine

    async def run() -> list[Any]:
        with anyio.fail_after(HANG):
            return [event async for event in engine.generate(prompt, params)]

    events = fuzz_server.call(run(), timeout=HANG + 5)
    assert events, "no event at all"
    *deltas, last = events
    assert all(isinstance(e, Delta) for e in deltas), events
    assert isinstance(last, Finished | Rejected | Aborted | Failed), last
    assert not isinstance(last, Failed | Aborted), last  # nobody aborted; nothing may fail
    if isinstance(last, Rejected):
        assert last.message
    fuzz_server.wait_idle(timeout=HANG)


def test_after_api_fuzz_the_engine_is_clean(fuzz_server: ServerThread) -> None:
    assert_idle_and_serving(fuzz_server)


def test_fuzz_encoder_writes_edge_numbers_raw() -> None:
    """The encoder writes what the strategies mean: huge ints and non-finite floats raw."""
    text = encode({"a": 10**400, "b": math.inf, "c": 1e-300}, "none").decode()
    assert "1" + "0" * 400 in text and "Infinity" in text and "1e-300" in text
