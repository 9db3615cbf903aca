"""POST /reset_prefix_cache (vLLM) and /update_weights_from_disk (SGLang) over HTTP, with the
engine in this process and in a child (ResetCache / UpdateWeightsFromDisk / EngineCallReply),
and through the router (every replica): what was dropped, SGLang's answer shape, the update
only with --allow-runtime-weight-updating, behind the API key; on a tiny Qwen3 in the engine
child, the update makes the completions B's (transformers' greedy) and a checkpoint of other
shapes is a 400 with B still answering."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from troupe.config import EngineConfig
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.router_harness import RouterThread

RESET, UPDATE = "/reset_prefix_cache", "/update_weights_from_disk"
ALLOW = GatewaySettings(allow_runtime_weight_updating=True)
PROMPT = [(7 * j + 3) % 256 for j in range(21)]


def _post(url: str, path: str, body: object = None, **headers: str) -> tuple[int, Any]:
    data = json.dumps(body if body is not None else {}).encode()
    request = urllib.request.Request(
        f"{url}{path}", data, {"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _complete(url: str, prompt: list[int], max_tokens: int = 5) -> list[int]:
    """The completion's token ids (logprobs' tokens as token ids)."""
    body = {
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "ignore_eos": True, "logprobs": 1, "return_tokens_as_token_ids": True,
    }  # fmt: skip
    status, answer = _post(url, "/v1/completions", body)
    assert status == 200, answer
    return [int(t.split(":")[1]) for t in answer["choices"][0]["logprobs"]["tokens"]]


@pytest.fixture(scope="module")
def in_process() -> Iterator[ServerThread]:
    srv = ServerThread(BASE_CONFIG, ALLOW, runner=FakeRunner.from_config(BASE_CONFIG)).start()
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def child() -> Iterator[ServerThread]:
    srv = ServerThread(BASE_CONFIG, ALLOW).start()
    yield srv
    srv.shutdown()


@pytest.fixture(params=["in_process", "child"])
def server(request: pytest.FixtureRequest) -> ServerThread:
    srv: ServerThread = request.getfixturevalue(request.param)
    return srv


def test_reset_prefix_cache_answers_what_it_dropped(server: ServerThread) -> None:
    _complete(server.url, list(range(1, 41)))  # 44 tokens computed: 2 full blocks of 16
    status, first = _post(server.url, RESET)
    assert status == 200 and first["success"] is True, first
    assert first["num_gpu_blocks_dropped"] >= 2 and first["num_cpu_blocks_dropped"] == 0
    assert f"dropped {first['num_gpu_blocks_dropped']} cached GPU blocks" in first["message"]
    status, second = _post(server.url, RESET)
    assert status == 200 and second["num_gpu_blocks_dropped"] == 0


def test_update_refusals_in_sglang_shape(server: ServerThread, tmp_path: Path) -> None:
    status, answer = _post(server.url, UPDATE, {"model_path": str(tmp_path)})
    assert status == 400 and answer["success"] is False
    assert "cannot replace its weights" in answer["message"]  # the fake runner holds none
    assert answer["num_paused_requests"] == 0
    status, answer = _post(server.url, UPDATE, {"model_path": str(tmp_path), "flush_cache": False})
    assert status == 400 and "flush_cache false" in answer["message"]
    status, answer = _post(server.url, UPDATE, {"model_path": str(tmp_path), "colour": 1})
    assert status == 400 and answer["error"]["param"] == "colour"
    assert _complete(server.url, [5, 6, 7])  # still serving


def test_update_needs_the_setting_and_both_need_the_key(in_process: ServerThread) -> None:
    off = in_process.add_gateway(GatewaySettings())
    assert _post(off, UPDATE, {"model_path": "/x"})[0] == 404
    assert _post(off, RESET)[0] == 200
    keyed = in_process.add_gateway(ALLOW.replace(api_key="k"))
    for path in (RESET, UPDATE):
        status, answer = _post(keyed, path, {"model_path": "/x"})
        assert status == 401 and answer["error"]["code"] == "missing_api_key"
    assert _post(keyed, RESET, Authorization="Bearer k")[0] == 200
    assert GatewaySettings().allow_runtime_weight_updating is False


def test_the_router_sends_both_to_every_replica(in_process: ServerThread) -> None:
    other = ServerThread(BASE_CONFIG, GatewaySettings(), runner=FakeRunner.from_config(BASE_CONFIG))
    other.start()
    router = RouterThread()
    try:
        urls = (in_process.url, other.url)
        router.start_router(RouterSettings(backend_urls=urls, health_check_interval_s=3600.0))
        _complete(other.url, list(range(1, 41)))
        status, answer = _post(router.url, RESET)
        assert status == 200 and answer["success"] and answer["replicas"] == 2
        assert answer["num_gpu_blocks_dropped"] >= 2  # other's, summed
        status, answer = _post(router.url, UPDATE, {"model_path": "/x"})
        assert status == 400 and not answer["success"]  # the first failure's status
        assert f"{other.url} answered 404" in answer["message"]  # no flag there
        assert f"{in_process.url} answered 400: this runner cannot" in answer["message"]
    finally:
        router.close()
        other.shutdown()


def test_update_in_the_engine_child_runs_the_new_weights(
    tmp_path: Path, hf_folder_pair: dict[str, tuple[Path, Any]]
) -> None:
    from tests.gpu.conftest import hf_greedy

    (a, hf_a), (b, hf_b), (c, _) = (hf_folder_pair[k] for k in "abc")
    config = EngineConfig(
        device="cpu", model=str(a), dtype="float32", block_size=4, num_kv_blocks=64,
        max_model_len=128, gc_freeze=False,
    )  # fmt: skip
    srv = ServerThread(config, ALLOW).start()
    try:
        assert _complete(srv.url, PROMPT, 6) == hf_greedy(hf_a, PROMPT, 6)
        status, answer = _post(srv.url, UPDATE, {"model_path": str(b), "load_format": "auto"})
        assert status == 200 and answer["success"] is True, answer
        assert answer["num_paused_requests"] == 0 and "copied" in answer["message"]
        assert _complete(srv.url, PROMPT, 6) == hf_greedy(hf_b, PROMPT, 6)
        status, answer = _post(srv.url, UPDATE, {"model_path": str(c)})
        assert status == 400 and "hidden_size: 64 != 32" in answer["message"]
        assert _complete(srv.url, PROMPT, 6) == hf_greedy(hf_b, PROMPT, 6)
    finally:
        srv.shutdown()


@pytest.fixture
def hf_folder_pair(tmp_path: Path) -> dict[str, tuple[Path, Any]]:
    """Qwen3 checkpoints a and b (same shapes, other weights), c (another width)."""
    from tests.gpu.conftest import add_word_tokenizer, make_hf_model

    made = {}
    for name, kwargs in {"a": {"seed": 0}, "b": {"seed": 1}, "c": {"hidden_size": 32}}.items():
        hf_model = make_hf_model("qwen3", **kwargs)
        hf_model.save_pretrained(tmp_path / name)
        add_word_tokenizer(tmp_path / name)
        made[name] = tmp_path / name, hf_model
    return made
