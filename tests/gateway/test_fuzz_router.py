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
from tests.gateway.fuzz_other_routes import EMBEDDINGS, RERANK, SCORE
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
