"""Fuzz the routes a classifier serves (the fake runner is an embedding model, so there they
are 400s): /classify, /v1/classify and /pooling (classify and token tasks) on a tiny random
Qwen3 sequence classifier, the engine in its child process, and generation refused by name.

Properties as in test_fuzz_openai_http.py: 2xx, or a 4xx in OpenAI's shape whose 400 names
the field; mangled bytes a 400; /health 200 and a classify request served after each example;
the engine clean after the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from troupe import EngineConfig
from troupe.gateway.state import GatewaySettings

from tests.gateway.conftest import ServerThread
from tests.gateway.fuzz_bodies import FUZZ, HANG, MUTATIONS, assert_clean, check_post
from tests.gateway.fuzz_other_routes import CLASSIFY, POOLING
from tests.gateway.fuzz_routes import COMPLETION
from tests.gpu.tiny_classifier import tiny_classifier

ROUTES = {"/classify": CLASSIFY, "/v1/classify": CLASSIFY, "/pooling": POOLING}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    folder = Path(tmp_path_factory.mktemp("fuzz-clf")) / "model"
    tiny_classifier(folder, "qwen3")
    config = EngineConfig(
        device="cpu", model=str(folder), max_model_len=128, max_num_seqs=4, gc_freeze=False
    )
    srv = ServerThread(config, GatewaySettings(max_body_bytes=256 * 1024)).start()
    yield srv
    srv.shutdown()


def assert_classifying(url: str) -> None:
    async def run() -> None:
        with anyio.fail_after(HANG):
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{url}/health") as resp:
                    assert resp.status == 200, await resp.text()
                async with http.post(f"{url}/classify", json={"input": "w1 w2"}) as resp:
                    assert resp.status == 200, await resp.text()
                    assert len((await resp.json())["data"][0]["probs"]) == 3

    anyio.run(run)


@st.composite
def route_bodies(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    path = draw(st.sampled_from([*sorted(ROUTES), "/v1/completions"]))
    return path, draw(ROUTES.get(path, COMPLETION))


@FUZZ
@given(route_body=route_bodies(), mutation=MUTATIONS)
def test_fuzz_a_classifiers_routes(
    classifier: ServerThread, route_body: tuple[str, dict[str, Any]], mutation: str
) -> None:
    path, body = route_body
    status, _ = check_post(classifier.url + path, body, mutation)
    if path == "/v1/completions":
        assert status != 200  # a classifier generates nothing: refused by name
    classifier.wait_idle(timeout=60)
    assert_classifying(classifier.url)


def test_after_the_fuzz_the_engine_is_clean(classifier: ServerThread) -> None:
    assert_clean(classifier)
    assert_classifying(classifier.url)
