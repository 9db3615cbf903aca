"""Fuzz the routes that manage a running engine, with the engine in its child process (as
`troupe serve` runs it, so every call crosses the process boundary): LoRA load and unload
(vLLM's shapes), /update_weights_from_disk (SGLang's), /reset_prefix_cache, and the sleep
routes' query strings (/sleep?level=&mode=, /wake_up?tags=; sleep mode is off here).

Properties: 2xx, or a 4xx (never 5xx) in OpenAI's shape (a 400 names its field) or, on the
routes that answer in vLLM's or SGLang's `{"success": false, "message"}`, in that one; mangled
bytes a 400; /health 200 and a normal request served after each example (the engine child
lives on); the engine clean after the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.fuzz_bodies import (
    FUZZ,
    HANG,
    JUNK,
    MUTATIONS,
    TEXT,
    assert_clean,
    assert_serving,
    check_error_shape,
    check_post,
)
from tests.gateway.fuzz_other_routes import ADMIN_ROUTES

CONFIG = BASE_CONFIG.replace(max_model_len=128, num_kv_blocks=256, enable_lora=True)
SUCCESS_SHAPED = ("/update_weights_from_disk", "/reset_prefix_cache")


@pytest.fixture(scope="module")
def child() -> Iterator[ServerThread]:
    settings = GatewaySettings(allow_runtime_lora_updating=True, allow_runtime_weight_updating=True)
    server = ServerThread(CONFIG, settings).start()  # no runner given: the engine child
    yield server
    server.shutdown()


def success_shaped(status: int, answer: Any) -> None:
    """vLLM's and SGLang's admin answers: `{"success": false, "message"}`, or OpenAI's error
    (a body that does not decode)."""
    assert status < 500, (status, answer)
    if isinstance(answer, dict) and "error" in answer:
        check_error_shape(status, answer)
        return
    assert isinstance(answer, dict) and answer["success"] is False, answer
    assert isinstance(answer["message"], str) and answer["message"], answer


@st.composite
def route_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from(sorted(ADMIN_ROUTES)))
    return path, draw(ADMIN_ROUTES[path])


@FUZZ
@given(route_body=route_bodies(), mutation=MUTATIONS)
def test_fuzz_admin_routes(
    child: ServerThread, route_body: tuple[str, dict[str, Any]], mutation: str
) -> None:
    path, body = route_body
    if path == "/reset_prefix_cache":
        mutation = "none"  # vLLM's takes no body: it reads none, so mangled bytes do no harm
    shape = success_shaped if path in SUCCESS_SHAPED else check_error_shape
    check_post(child.url + path, body, mutation, (200, 400, 404, 409), shape)
    assert_serving(child.url)


QUERY_VALUES = st.sampled_from(["1", "2", "0", "-1", "3", "", "x", "1e9", "9" * 30]) | TEXT
SLEEP_QUERY = st.dictionaries(
    st.sampled_from(["level", "mode", "tags", "x"]),
    QUERY_VALUES | st.sampled_from(["refuse", "wait", "abort", "weights", "kv_cache"]),
    max_size=3,
)


@FUZZ
@given(path=st.sampled_from(["/sleep", "/wake_up"]), query=SLEEP_QUERY, body=JUNK)
def test_fuzz_sleep_queries(
    child: ServerThread, path: str, query: dict[str, str], body: Any
) -> None:
    """Sleep mode is off: every call is refused by name, whatever it carries."""

    async def run() -> tuple[int, Any]:
        with anyio.fail_after(HANG):
            async with aiohttp.ClientSession() as http:
                raw = {k: v.encode("utf-8", "surrogatepass") for k, v in query.items()}
                url = f"{child.url}{path}?{urlencode(raw)}"
                async with http.post(url, json=body) as resp:
                    return resp.status, await resp.json()

    status, answer = anyio.run(run)
    assert status == 400, answer
    success_shaped(status, answer)
    assert_serving(child.url)


def test_after_the_fuzz_the_engine_is_clean(child: ServerThread) -> None:
    assert_clean(child)
    assert_serving(child.url)


# -- bugs the fuzz found ------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["9" * 30, "-" + "9" * 30, "3", "0"])
def test_a_sleep_level_out_of_range_is_a_400_naming_it(child: ServerThread, level: str) -> None:
    """Was a 500 for the huge ones: the level went to the engine child as an int msgpack
    cannot hold (OverflowError); the gateway now checks it as it checks `mode`."""

    async def run() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{child.url}/sleep?level={level}") as resp:
                return resp.status, await resp.json()

    status, answer = anyio.run(run)
    assert status == 400, answer
    assert answer["error"]["param"] == "level" and "1 or 2" in answer["error"]["message"]
    assert_serving(child.url)
