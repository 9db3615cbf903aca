"""Shared pieces of the route fuzzers (tests/gateway/test_fuzz_*.py): value strategies, a body
perturber, a byte-level mangler, and the checks every answer must pass.

A fuzzed body starts valid (its required fields and a few optional ones), then up to two
fields (known, or one no body has) are set to an edge number or junk of any JSON type; the
bytes may then be mangled (cut short, nested 5000 deep, invalid UTF-8, bare NaN/Infinity
literals, quotes broken). What the server answers must be 2xx, or a 4xx in OpenAI's error
shape; a 400 names the field it is about (`param`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
import anyio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

HANG = 60.0  # s: a hang detector only; nothing here waits on a clock otherwise

# Derandomized (CI reruns the same examples), no example database, no deadline: the server's
# pace on a loaded 2-core machine is not the property under test.
FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

EDGE_NUMBERS = st.sampled_from(
    [0, -1, 1, 2, 2**31 - 1, 2**31, -(2**31), 2**63, 2**64, 10**30, 10**400,
     0.0, -0.0, 0.5, 1.5, 1e-300, 1e30, 1e308, -1e308,
     float("nan"), float("inf"), float("-inf")]
)  # fmt: skip
SCALARS = (
    st.none() | st.booleans() | st.integers() | EDGE_NUMBERS | st.floats() | st.text(max_size=8)
)
JUNK: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
# Within a 256 kB body: a long text, long lists of ids, of stop-like strings, of messages,
# a wide logit_bias, a wide object.
HUGE = st.sampled_from(
    [
        "x" * 200_000,
        "\u00e9 " * 25_000,
        list(range(30_000)),
        ["ab"] * 30_000,
        [{"role": "user", "content": "hi"}] * 5_000,
        {str(i): 1.0 for i in range(12_000)},
        [[1, 2]] * 20_000,
    ]
)
# Lone surrogates too: json.dumps writes them as \ud800 escapes.
TEXT = st.text(max_size=24) | st.text(st.characters(exclude_categories=()), max_size=6)
TOKEN_IDS = st.lists(st.integers(0, 40000), min_size=1, max_size=6)


@st.composite
def perturbed(
    draw: st.DrawFn,
    valid: dict[str, st.SearchStrategy[Any]],
    required: tuple[str, ...],
    extra: tuple[str, ...] = (),
    huge: bool = False,
) -> dict[str, Any]:
    """A valid body (its required fields and some optional ones), then up to two fields
    (`extra`: names valid bodies leave out) set to an edge number or junk, or dropped;
    `huge`: or to a string or list of a few hundred kB (HUGE; bodies for a 256 kB limit)."""
    breaks = EDGE_NUMBERS | JUNK | HUGE if huge else EDGE_NUMBERS | JUNK
    body = {name: draw(valid[name]) for name in required}
    for name in draw(st.lists(st.sampled_from(sorted(valid)), unique=True, max_size=4)):
        body[name] = draw(valid[name])
    names = sorted(valid) + list(extra) + ["frobnicate"]
    for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=2)):
        if name in body and draw(st.integers(0, 3)) == 0:
            del body[name]  # a required field missing, now and then
        else:
            body[name] = draw(breaks)
    return body


MUTATIONS = st.sampled_from(
    ["none", "none", "none", "none", "truncate", "deep", "garbage", "utf8", "nan"]
)


def encode(body: Any, mutation: str) -> bytes:
    """JSON text of `body` (non-finite floats and huge ints written raw), maybe mangled; every
    mangling but "none" makes bytes no JSON decoder takes."""
    text = json.dumps(body, allow_nan=True)
    match mutation:
        case "truncate":
            text = text[: len(text) // 2] if len(text) > 2 else "{"
        case "deep":
            text = (
                text[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
                if text != "{}"
                else ('{"x": ' + "[" * 5000 + "]" * 5000 + "}")
            )
        case "garbage":
            text = "{'" + text[1:]
        case "utf8":
            return text[:-1].encode("utf-8", "surrogatepass") + b', "\xff\xfe": 1}'
        case "nan":
            text = text[:-1] + (", " if text != "{}" else "") + '"x": NaN}'
    return text.encode("utf-8", "surrogatepass")


def check_error_shape(status: int, answer: Any) -> None:
    """A 4xx in OpenAI's shape; a 400 names its field."""
    assert status < 500, (status, answer)
    assert isinstance(answer, dict) and set(answer) >= {"error"}, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    if status == 400:
        assert isinstance(error["param"], str) and error["param"], error


async def post(url: str, data: bytes) -> tuple[int, Any]:
    """POST raw JSON bytes; the status and the answer: a JSON body, an SSE stream's lines, or
    text (vLLM's LoRA routes answer success in plain text)."""
    async with aiohttp.ClientSession() as http:
        headers = {"Content-Type": "application/json"}
        async with http.post(url, data=data, headers=headers) as resp:
            kind = resp.headers.get("Content-Type", "")
            if kind.startswith("text/event-stream"):
                lines = [line async for line in resp.content]
                assert resp.status == 200 and lines, (resp.status, lines[-3:])
                return resp.status, lines
            if kind.startswith("application/json"):
                return resp.status, await resp.json()
            assert resp.status == 200, (resp.status, await resp.text())
            return resp.status, await resp.text()


def check_post(
    url: str,
    body: Any,
    mutation: str,
    allowed: tuple[int, ...] = (200, 400, 404, 413),
    error_shape: Callable[[int, Any], None] = check_error_shape,
) -> tuple[int, Any]:
    """POST one fuzzed body; the answer is in `allowed`, errors in shape, mangled bytes 400."""

    async def run() -> tuple[int, Any]:
        with anyio.fail_after(HANG):
            return await post(url, encode(body, mutation))

    status, answer = anyio.run(run)
    if status >= 400:
        error_shape(status, answer)
    assert status in allowed, (status, answer)
    if isinstance(answer, list):  # an SSE stream
        check_stream_end(url, answer)
    if mutation != "none":  # named: `body`, or a field before the break (one-pass decoding)
        assert status in (400, 413), (status, answer)  # 413: huge fields past the limit first
    return status, answer


_RESPONSES_ENDS = {"response.completed", "response.failed", "response.incomplete", "error"}
_MESSAGES_ENDS = {"message_stop", "error"}  # Anthropic's


def check_stream_end(url: str, lines: list[bytes]) -> None:
    """One terminal event, last: `data: [DONE]` on completions and chat, a Responses stream's
    terminal event on /v1/responses, message_stop or error on /v1/messages; each error event
    with its message."""
    data = [line[6:].strip() for line in lines if line.startswith(b"data: ")]
    for item in data:
        if item.startswith(b"{") and b'"error"' in item:
            parsed = json.loads(item)
            if "error" in parsed and isinstance(parsed["error"], dict):
                assert parsed["error"].get("message"), parsed
    named_ends = {"/v1/responses": _RESPONSES_ENDS, "/v1/messages": _MESSAGES_ENDS}
    if url.endswith(tuple(named_ends)):
        events = [line[7:].strip().decode() for line in lines if line.startswith(b"event: ")]
        ends = [e for e in events if e in named_ends[url[url.index("/v1/") :]]]
        assert len(ends) == 1 and events[-1] == ends[0], events[-3:]
    else:
        assert data.count(b"[DONE]") == 1 and data[-1] == b"[DONE]", data[-3:]


def assert_serving(url: str) -> None:
    """/health answers 200 and a normal request completes."""

    async def run() -> None:
        with anyio.fail_after(HANG):
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/health") as resp:
                    assert resp.status == 200, await resp.text()
                body = {"prompt": "hello", "max_tokens": 2, "ignore_eos": True}
                async with http.post(f"{url}/v1/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    assert (await resp.json())["usage"]["completion_tokens"] == 2

    anyio.run(run)


def assert_clean(server: Any) -> None:
    """The engine (a conftest ServerThread's) is idle: nothing running, waiting or swapped,
    every KV block back in its pool (cached prefix blocks are free)."""
    server.wait_idle(timeout=HANG)
    stats = server.engine.stats()
    assert stats.num_gpu_blocks_used == 0 and stats.num_cpu_blocks_used == 0, stats
    assert stats.num_running == stats.num_waiting == stats.num_swapped == 0, stats
