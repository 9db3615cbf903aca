"""Fuzz the websocket protocol (GET /v1/ws): generate frames with every SamplingParams field
(those a client should never set, such as `pooling` or `bad_words_token_ids`, included), chat
frames, cancels of unknown ids, unknown types, frames that are not objects, not JSON, binary,
nested 3000 deep, and frames past the size limit.

Properties: every frame the server sends is a delta, done or error; an error has a code and a
message, and a refused request's error names its field; after any frames that fit the limit
the socket goes on and serves a sentinel request to `done`; a frame past the limit closes the
socket with 1009 (message too big) and a new socket is served; /health 200 and a normal HTTP
request after each example; the engine clean after the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.fuzz_bodies import (
    FUZZ,
    HANG,
    JUNK,
    TEXT,
    TOKEN_IDS,
    assert_clean,
    assert_serving,
    perturbed,
)
from tests.gateway.fuzz_routes import MESSAGE, SAMPLING

CONFIG = BASE_CONFIG.replace(
    max_model_len=128, num_kv_blocks=512, num_cpu_blocks=16, lora_modules=("sql=/adapters/sql",)
)
LIMIT = 64 * 1024  # max_body_bytes: also the largest frame


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerThread]:
    settings = GatewaySettings(max_body_bytes=LIMIT)
    server = ServerThread(CONFIG, settings, runner=FakeRunner.from_config(CONFIG)).start()
    yield server
    server.shutdown()


HTTP_ONLY = ("stream", "stream_options", "user", "use_beam_search", "length_penalty")
PARAMS: dict[str, st.SearchStrategy[Any]] = {
    **{name: value for name, value in SAMPLING.items() if name not in HTTP_ONLY},
    "logprobs": st.integers(-1, 30),
    "best_of": st.integers(0, 3),
    "lora": st.sampled_from(["sql", "nope"]),
    "pooling": st.fixed_dictionaries(
        {},
        optional={
            "task": st.sampled_from(["embed", "classify", "token_embed", "x"]),
            "type": st.sampled_from(["last", "mean", "cls", "x"]),
            "normalize": st.booleans(),
        },
    ),
    "bad_words_token_ids": JUNK,
    "add_generation_prompt": st.booleans(),
    "chat_template_kwargs": JUNK,
}
IDS = st.sampled_from(["a", "b", "c", "", "x" * 200]) | TEXT | JUNK
GENERATE = st.one_of(
    perturbed(
        {**PARAMS, "type": st.just("generate"), "request_id": IDS,
         "prompt": TEXT | TOKEN_IDS | st.lists(st.integers(-3, 2**40), max_size=3)},
        ("type", "request_id", "prompt"), ("messages",)),
    perturbed(
        {**PARAMS, "type": st.just("generate"), "request_id": IDS,
         "messages": st.lists(MESSAGE, max_size=3)},
        ("type", "request_id", "messages"), ("prompt",)),
)  # fmt: skip
CANCEL = perturbed({"type": st.just("cancel"), "request_id": IDS}, ("type", "request_id"))


def _json(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


FRAME = st.one_of(
    GENERATE.map(_json),
    GENERATE.map(_json),
    CANCEL.map(_json),
    st.fixed_dictionaries({"type": JUNK, "request_id": IDS}).map(_json),
    JUNK.map(_json),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.just("[" * 3000 + "]" * 3000),
    st.just('{"type": "generate", "request_id": "big", "prompt": "' + "y" * 60000 + '"}'),
)
SENTINEL = {"type": "generate", "request_id": "sentinel", "prompt": "x", "max_tokens": 2}


def check_frame(frame: dict[str, Any]) -> None:
    assert frame["type"] in ("delta", "done", "error"), frame
    if frame["type"] == "error":
        assert frame["code"] and frame["message"], frame
        if frame["request_id"] is not None and frame["code"] == "invalid_request":
            assert frame["field"], frame  # a refused request names what was wrong


@FUZZ
@given(frames=st.lists(FRAME, min_size=1, max_size=6))
def test_fuzz_websocket_frames(srv: ServerThread, frames: list[str | bytes]) -> None:
    url = srv.url.replace("http://", "ws://") + "/v1/ws"

    async def run() -> None:
        with anyio.fail_after(HANG):
            async with connect(url, max_size=None) as ws:
                for frame in frames:
                    await ws.send(frame)
                await ws.send(json.dumps(SENTINEL))
                while True:
                    got = json.loads(await ws.recv())
                    check_frame(got)
                    if got["request_id"] == "sentinel" and got["type"] != "delta":
                        assert got["type"] == "done", got
                        return

    anyio.run(run)
    srv.wait_idle(timeout=HANG)  # closing the socket aborted what was left
    assert_serving(srv.url)


@pytest.mark.parametrize("frame", ["x" * (LIMIT + 1), b"\x00" * (LIMIT + 1)])
def test_a_frame_past_the_limit_closes_with_1009_and_nothing_else_is_lost(
    srv: ServerThread, frame: str | bytes
) -> None:
    url = srv.url.replace("http://", "ws://") + "/v1/ws"

    async def run() -> None:
        with anyio.fail_after(HANG):
            async with connect(url, max_size=None) as other:
                await other.send(json.dumps(SENTINEL))  # another client's request
                async with connect(url, max_size=None) as ws:
                    await ws.send(frame)
                    with pytest.raises(ConnectionClosed) as info:
                        while True:
                            check_frame(json.loads(await ws.recv()))
                    assert info.value.rcvd is not None and info.value.rcvd.code == 1009
                while True:
                    got = json.loads(await other.recv())
                    if got["type"] != "delta":
                        assert got["type"] == "done", got
                        return

    anyio.run(run)
    srv.wait_idle(timeout=HANG)
    assert_serving(srv.url)


def test_after_the_fuzz_the_engine_is_clean(srv: ServerThread) -> None:
    assert_clean(srv)
    assert_serving(srv.url)
