"""Fuzz the generating routes' every field: /v1/completions (beam search, structured output,
logprobs, prompt_embeds, token-id prompts), /v1/chat/completions (tools, tool_choice,
response_format schemas xgrammar refuses, template options), /v1/responses, SGLang's
/generate, Anthropic's /v1/messages and its count_tokens, and SageMaker's /invocations with
completions and chat bodies.

Properties, for any body: the answer is 2xx, or a 4xx in OpenAI's shape whose 400 names the
field (`param`; Anthropic's shape on its paths); mangled bytes are a 400 on `body`; nothing hangs (HANG is only a hang
detector); after each example /health is 200 and a normal request completes; after the
module the engine holds no request and no KV block. One in-process fake-runner server for the
module, max_model_len 128 (a huge max_tokens still ends soon). Derandomized: CI reruns the
same examples. Each bug these found has an example-based test at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.fuzz_anthropic import COUNT_TOKENS, MESSAGES, check_anthropic_error
from tests.gateway.fuzz_bodies import (
    FUZZ,
    HANG,
    MUTATIONS,
    TEXT,
    assert_clean,
    assert_serving,
    check_error_shape,
    check_post,
    check_stream_end,
    encode,
    post,
)
from tests.gateway.fuzz_generate import GENERATE
from tests.gateway.fuzz_routes import CHAT, COMPLETION, RESPONSES, ROUTES

CONFIG = BASE_CONFIG.replace(
    max_model_len=128, num_kv_blocks=512, num_cpu_blocks=16, lora_modules=("sql=/adapters/sql",)
)


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerThread]:
    settings = GatewaySettings(max_body_bytes=256 * 1024)
    server = ServerThread(CONFIG, settings, runner=FakeRunner.from_config(CONFIG)).start()
    yield server
    server.shutdown()


def fuzz(server: ServerThread, path: str, body: dict[str, Any], mutation: str) -> None:
    check_post(server.url + path, body, mutation)
    server.wait_idle(timeout=60)
    assert_serving(server.url)


@settings(FUZZ, max_examples=50)
@given(body=COMPLETION, mutation=MUTATIONS)
def test_fuzz_completions(srv: ServerThread, body: dict[str, Any], mutation: str) -> None:
    fuzz(srv, "/v1/completions", body, mutation)


@settings(FUZZ, max_examples=50)
@given(body=CHAT, mutation=MUTATIONS)
def test_fuzz_chat_completions(srv: ServerThread, body: dict[str, Any], mutation: str) -> None:
    fuzz(srv, "/v1/chat/completions", body, mutation)


@FUZZ
@given(body=RESPONSES, mutation=MUTATIONS)
def test_fuzz_responses(srv: ServerThread, body: dict[str, Any], mutation: str) -> None:
    fuzz(srv, "/v1/responses", body, mutation)


@FUZZ
@given(body=GENERATE, mutation=MUTATIONS)
def test_fuzz_sglang_generate(srv: ServerThread, body: dict[str, Any], mutation: str) -> None:
    fuzz(srv, "/generate", body, mutation)


@FUZZ
@given(body=MESSAGES, mutation=MUTATIONS)
def test_fuzz_anthropic_messages(srv: ServerThread, body: dict[str, Any], mutation: str) -> None:
    check_post(srv.url + "/v1/messages", body, mutation, error_shape=check_anthropic_error)
    srv.wait_idle(timeout=60)
    assert_serving(srv.url)


@settings(FUZZ, max_examples=30)
@given(body=COUNT_TOKENS, mutation=MUTATIONS)
def test_fuzz_anthropic_count_tokens(
    srv: ServerThread, body: dict[str, Any], mutation: str
) -> None:
    path = "/v1/messages/count_tokens"
    status, answer = check_post(srv.url + path, body, mutation, error_shape=check_anthropic_error)
    if status == 200:
        assert set(answer) == {"input_tokens"} and answer["input_tokens"] > 0, answer


@settings(FUZZ, max_examples=30)
@given(body=st.sampled_from([COMPLETION, CHAT]).flatmap(lambda s: s), mutation=MUTATIONS)
def test_fuzz_invocations(srv: ServerThread, body: dict[str, Any], mutation: str) -> None:
    """SageMaker's /invocations runs completions and chat bodies as their routes do."""
    fuzz(srv, "/invocations", body, mutation)


GOOD = {
    "prompt": "a neighbour",
    "max_tokens": 20,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}


EVERY_ROUTE = {**ROUTES, "/generate": GENERATE, "/v1/messages": MESSAGES}


@settings(FUZZ, max_examples=20)
@given(paths=st.lists(st.sampled_from(sorted(EVERY_ROUTE)), min_size=2, max_size=6), data=st.data())
def test_fuzz_bad_bodies_beside_a_good_stream(
    srv: ServerThread, paths: list[str], data: st.DataObject
) -> None:
    """Bodies of every route at once beside a streamed request: each is answered as alone
    would be, and the neighbour gets all of its 20 tokens (nothing is lost for anyone else)."""
    drawn = [(path, data.draw(EVERY_ROUTE[path]), data.draw(MUTATIONS)) for path in paths]

    async def one(path: str, body: Any, mutation: str) -> tuple[int, Any]:
        return await post(srv.url + path, encode(body, mutation))

    async def run() -> list[tuple[int, Any]]:
        results: list[tuple[int, Any]] = [(0, None)] * (len(drawn) + 1)

        async def into(i: int, path: str, body: Any, mutation: str) -> None:
            results[i] = await one(path, body, mutation)

        with anyio.fail_after(HANG):
            async with anyio.create_task_group() as tg:
                tg.start_soon(into, 0, "/v1/completions", GOOD, "none")
                for i, (path, body, mutation) in enumerate(drawn, 1):
                    tg.start_soon(into, i, path, body, mutation)
        return results

    (status, lines), *others = anyio.run(run)
    assert status == 200, lines
    chunks = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
    assert sum(len(c["choices"][0]["text"]) > 0 for c in chunks if c["choices"]) >= 1
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 20, usage
    check_stream_end(srv.url + "/v1/completions", lines)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length", finishes
    for (path, _, _), (other_status, answer) in zip(drawn, others, strict=True):
        if other_status >= 400 and path == "/v1/messages":
            check_anthropic_error(other_status, answer)
        elif other_status >= 400:
            check_error_shape(other_status, answer)
        assert other_status in (200, 400, 404, 413), (path, other_status, answer)
    srv.wait_idle(timeout=HANG)


QUERY_VALUES = st.sampled_from(["true", "false", "0", "-1", "5", "", "asc", "desc", "x"]) | TEXT
STORED_QUERY = st.dictionaries(
    st.sampled_from(["stream", "starting_after", "order", "limit", "after", "include[]"]),
    QUERY_VALUES | st.integers(-5, 2**64).map(str),
    max_size=3,
)
STORED_CALLS = st.sampled_from(
    [("GET", ""), ("DELETE", ""), ("POST", "/cancel"), ("GET", "/input_items")]
)


@pytest.fixture(scope="module")
def stored_id(srv: ServerThread) -> str:
    body = {"input": "hello", "max_output_tokens": 3, "store": True}

    async def run() -> tuple[int, Any]:
        return await post(srv.url + "/v1/responses", json.dumps(body).encode())

    status, answer = anyio.run(run)
    assert status == 200, answer
    return str(answer["id"])


@FUZZ
@given(
    call=STORED_CALLS,
    which=st.sampled_from(["stored", "resp_nope", "x", "resp_" + "0" * 40]) | TEXT,
    query=STORED_QUERY,
)
def test_fuzz_stored_responses(
    srv: ServerThread, stored_id: str, call: tuple[str, str], which: str, query: dict[str, str]
) -> None:
    """GET, DELETE, cancel and input_items of a stored response (or one that is not) with any
    query: 2xx, or a 4xx in shape. A DELETE of the stored one makes the rest 404s."""
    method, tail = call
    raw = {k: raw_bytes(v) for k, v in query.items()}  # lone surrogates: as their bytes
    response_id = stored_id if which == "stored" else quote(raw_bytes(which), safe="")
    url = f"{srv.url}/v1/responses/{response_id}{tail}?{urlencode(raw)}"

    async def run() -> tuple[int, Any]:
        with anyio.fail_after(HANG):
            async with aiohttp.ClientSession() as http:
                async with http.request(method, url) as resp:
                    if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                        return resp.status, [line async for line in resp.content]
                    return resp.status, await resp.json()

    status, answer = anyio.run(run)
    if status >= 400:
        check_error_shape(status, answer)
    assert status in (200, 400, 404, 409), (status, answer)
    assert_serving(srv.url)


def raw_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def test_after_the_fuzz_the_engine_is_clean(srv: ServerThread) -> None:
    assert_clean(srv)
    assert_serving(srv.url)


def test_the_mangler_breaks_what_it_claims() -> None:
    """Each mutation's bytes are refused by a strict JSON reader (so the fuzz's 400 is owed)."""
    body = {"prompt": "x", "n": 10**400}
    for mutation in ("truncate", "deep", "garbage", "utf8", "nan"):
        data = encode(body, mutation)
        with pytest.raises((ValueError, RecursionError)):
            json.loads(data.decode("utf-8"), parse_constant=_refuse)
    assert b"1" + b"0" * 400 in encode(body, "none")


def _refuse(name: str) -> None:
    raise ValueError(name)


# -- bugs the fuzz found ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        # U+7D936 is 0xf1 0xbd 0xa4 0xb6: no token of the vocabulary starts with 0xf1
        ("/v1/completions", {"prompt": "hi", "guided_choice": ["\U0007d936"]}, "guided_choice"),
        ("/v1/completions", {"prompt": "hi", "guided_choice": ["ok", "a\x04"]}, "guided_choice"),
        ("/v1/completions", {"prompt": "hi", "guided_regex": "\\x04+"}, "guided_regex"),
        ("/v1/completions", {"prompt": "hi", "guided_regex": "ab\\x04"}, "guided_regex"),
        ("/v1/completions", {"prompt": "hi", "guided_json": {"const": "\U0007d936"}}, "guided_json"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}],
             "structured_outputs": {"choice": ["\x04"]}},
            "structured_outputs.choice",
        ),
    ],
)  # fmt: skip
def test_structured_output_the_vocabulary_cannot_write_is_a_400(
    srv: ServerThread, path: str, body: dict[str, Any], param: str
) -> None:
    """Was a 500 ("structured output failed at step N"): the first mask allowed no token, the
    model sampled one the grammar refused."""
    status, answer = check_post(srv.url + path, body, "none")
    assert status == 400, answer
    assert answer["error"]["param"] == param, answer
    message = answer["error"]["message"]
    assert any(why in message for why in ("cannot be written", "can begin", "no token")), message
    assert_serving(srv.url)
