"""Fuzz the router (`troupe router`): it reads each body for its routing key (the prompt, the
messages, the input) before it proxies it, so a body it cannot read must still be answered in
shape, and what the replica refuses must come back unchanged. One replica (a fake-runner
server in this process) behind one router.

Properties: 2xx, or a 4xx in OpenAI's shape whose 400 names the field (never 5xx: the replica
is up); mangled bytes a 400; the router's /health 200 and a normal request served through it
after each example; the replica's engine clean after the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.fuzz_bodies import (
    FUZZ,
    MUTATIONS,
    assert_clean,
    assert_serving,
    check_error_shape,
    check_post,
    post,
)
from tests.gateway.fuzz_other_routes import ADMIN_ROUTES, EMBEDDINGS, RERANK, SCORE
from tests.gateway.fuzz_routes import CHAT, COMPLETION, RESPONSES
from tests.gateway.router_harness import RouterThread

CONFIG = BASE_CONFIG.replace(max_model_len=128, num_kv_blocks=512, num_cpu_blocks=16)
ROUTES = {
    "/v1/completions": COMPLETION,
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESPONSES,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/score": SCORE,
    "/v1/rerank": RERANK,
}


@pytest.fixture(scope="module")
def replica() -> Iterator[ServerThread]:
    settings = GatewaySettings(max_body_bytes=256 * 1024, engine_process=False)
    server = ServerThread(CONFIG, settings, runner=FakeRunner.from_config(CONFIG)).start()
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def router(replica: ServerThread) -> Iterator[RouterThread]:
    settings = RouterSettings(
        backend_urls=(replica.url,), health_check_interval_s=3600.0, max_body_bytes=256 * 1024
    )
    front = RouterThread().start_router(settings)
    yield front
    front.close()


@st.composite
def route_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from(sorted(ROUTES)))
    return path, draw(ROUTES[path])


@FUZZ
@given(route_body=route_bodies(), mutation=MUTATIONS)
def test_fuzz_through_the_router(
    router: RouterThread,
    replica: ServerThread,
    route_body: tuple[str, dict[str, Any]],
    mutation: str,
) -> None:
    path, body = route_body
    check_post(router.url + path, body, mutation)
    replica.wait_idle(timeout=60)
    assert_serving(router.url)


def test_after_the_fuzz_the_replica_is_clean(router: RouterThread, replica: ServerThread) -> None:
    assert_clean(replica)
    assert_serving(router.url)


# -- bugs the fuzz found ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        '{"messages": [], "x": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "[" * 5000 + "]" * 5000,
    ],
)
def test_a_body_nested_too_deep_for_the_router_is_the_replicas_400(
    router: RouterThread, data: str
) -> None:
    """Was a plain-text 500: the router's json.loads (for the routing key) raised
    RecursionError, which its error middleware did not catch."""
    path = "/v1/chat/completions" if "messages" in data else "/v1/completions"

    async def run() -> tuple[int, Any]:
        return await post(router.url + path, data.encode())

    status, answer = anyio.run(run)
    assert status == 400, answer
    check_error_shape(status, answer)
    assert answer["error"]["param"] in ("body", "x", "prompt[0][0]"), answer
    assert_serving(router.url)


# -- the routes the router fans out to every replica --------------------------------------------

ADMIN_CONFIG = CONFIG.replace(enable_lora=True)


@pytest.fixture(scope="module")
def admin_router() -> Iterator[tuple[RouterThread, list[ServerThread]]]:
    """Two replicas that allow run-time LoRA and weight updates, behind their own router."""
    settings = GatewaySettings(
        engine_process=False, allow_runtime_lora_updating=True, allow_runtime_weight_updating=True
    )
    replicas = [
        ServerThread(ADMIN_CONFIG, settings, runner=FakeRunner.from_config(ADMIN_CONFIG)).start()
        for _ in range(2)
    ]
    urls = tuple(r.url for r in replicas)
    front = RouterThread().start_router(
        RouterSettings(backend_urls=urls, health_check_interval_s=3600.0)
    )
    yield front, replicas
    front.close()
    for replica in replicas:
        replica.shutdown()


@st.composite
def admin_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from(sorted(ADMIN_ROUTES)))
    return path, draw(ADMIN_ROUTES[path])


def fanned_out_shape(status: int, answer: Any) -> None:
    """OpenAI's error, or vLLM's and SGLang's `{"success": false, "message"}`."""
    assert status < 500, (status, answer)
    if isinstance(answer, dict) and "error" in answer:
        check_error_shape(status, answer)
    else:
        assert answer["success"] is False and answer["message"], answer


@FUZZ
@given(route_body=admin_bodies(), mutation=MUTATIONS)
def test_fuzz_admin_routes_through_the_router(
    admin_router: tuple[RouterThread, list[ServerThread]],
    route_body: tuple[str, dict[str, Any]],
    mutation: str,
) -> None:
    front, replicas = admin_router
    path, body = route_body
    if path == "/reset_prefix_cache":
        mutation = "none"  # vLLM's takes no body: it reads none
    allowed = (200, 400, 404, 409, 413)
    check_post(front.url + path, body, mutation, allowed, fanned_out_shape)
    assert_serving(front.url)
    for replica in replicas:
        replica.wait_idle(timeout=60)


def test_after_the_admin_fuzz_the_replicas_agree_and_are_clean(
    admin_router: tuple[RouterThread, list[ServerThread]],
) -> None:
    """Every replica serves the same adapters (a load that failed somewhere was undone);
    nothing held."""
    _, replicas = admin_router
    for replica in replicas:
        assert_clean(replica)
    names = [sorted(replica.engine.lora_adapters) for replica in replicas]
    assert names[0] == names[1], names


@pytest.mark.parametrize("path", ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"])
def test_a_lora_body_nested_too_deep_is_the_replicas_400(
    admin_router: tuple[RouterThread, list[ServerThread]], path: str
) -> None:
    """Was a plain-text 500: naming the adapter in the router's error message read the body
    with json.loads, which raised RecursionError."""
    front, _ = admin_router
    data = '{"lora_name": "x", "lora_path": "/a", "x": ' + "[" * 5000 + "]" * 5000 + "}"

    async def run() -> tuple[int, Any]:
        return await post(front.url + path, data.encode())

    status, answer = anyio.run(run)
    assert status == 400, answer
    check_error_shape(status, answer)
    assert "failed on 2 of 2 replicas" in answer["error"]["message"], answer
    assert_serving(front.url)


def test_a_bug_in_the_router_answers_a_500_in_openai_shape(
    router: RouterThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two 500s above came as aiohttp's plain text: the router's middleware now answers
    any escaped exception in OpenAI's shape, as the gateway's does."""

    def broken(*_: Any) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr("troupe.gateway.router_proxy.routing_key", broken)

    async def run() -> tuple[int, Any]:
        return await post(router.url + "/v1/completions", b'{"prompt": "x"}')

    status, answer = anyio.run(run)
    assert status == 500 and answer["error"]["code"] == "internal_error", answer
    assert "a bug" in answer["error"]["message"]
