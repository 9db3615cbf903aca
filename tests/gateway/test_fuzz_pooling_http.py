"""Fuzz the routes that answer one JSON body without generating text: /v1/embeddings,
SGLang's /encode, /pooling, /classify, /v1/score, /v1/rerank and /rerank (vLLM's shapes), /tokenize and
/detokenize. The fake runner serves made-up embeddings (an embedding model: /classify and
the classify tasks are 400s naming `model` or `task`).

Properties as in test_fuzz_openai_http.py: 2xx, or a 4xx in OpenAI's shape whose 400 names
the field; mangled bytes a 400; /health 200 and a normal request served after each example;
the engine clean after the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.fuzz_bodies import FUZZ, MUTATIONS, assert_clean, assert_serving, check_post
from tests.gateway.fuzz_other_routes import POOLING_ROUTES

CONFIG = BASE_CONFIG.replace(
    max_model_len=128, num_kv_blocks=512, num_cpu_blocks=16, lora_modules=("sql=/adapters/sql",)
)


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerThread]:
    settings = GatewaySettings(max_body_bytes=256 * 1024, max_embedding_inputs=8)
    server = ServerThread(CONFIG, settings, runner=FakeRunner.from_config(CONFIG)).start()
    yield server
    server.shutdown()


@st.composite
def route_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from(sorted(POOLING_ROUTES)))
    return path, draw(POOLING_ROUTES[path])


@FUZZ
@given(route_body=route_bodies(), mutation=MUTATIONS)
def test_fuzz_pooling_and_tokenizer_routes(
    srv: ServerThread, route_body: tuple[str, dict[str, Any]], mutation: str
) -> None:
    path, body = route_body
    check_post(srv.url + path, body, mutation)
    srv.wait_idle(timeout=60)
    assert_serving(srv.url)


@pytest.mark.parametrize("path", sorted(POOLING_ROUTES))
@FUZZ
@given(data=st.data())
def test_fuzz_each_route(srv: ServerThread, path: str, data: st.DataObject) -> None:
    """A few bodies on every route (the mixed test above may draw some routes seldom)."""
    body = data.draw(POOLING_ROUTES[path])
    check_post(srv.url + path, body, data.draw(MUTATIONS))


def test_after_the_fuzz_the_engine_is_clean(srv: ServerThread) -> None:
    assert_clean(srv)
    assert_serving(srv.url)
