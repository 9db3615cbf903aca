"""A real LoRA adapter (random A and B on SmolLM2, the CPU) through every way in besides HTTP:
a websocket frame's `model` (or `lora`), an OpenAI Batch file's line body's `model` in
`troupe run-batch --lora-modules`, and `troupe generate --lora` (its adapter given in vLLM's
JSON form of --lora-modules). Each answers what HTTP answers for the same model on an engine of
the same settings, the adapter's text is not the base model's, and an unknown name is refused
naming `model` (or `--lora`) while the rest run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from troupe.config import EngineConfig
from troupe.gateway.state import GatewaySettings
from troupe.ops.cli import main
from websockets.asyncio.client import connect

from tests.gateway.conftest import ServerThread
from tests.lora.adapters import SMOLLM2_SHAPES, raw_adapter

PROMPT = "The capital of France is"
USER = [{"role": "user", "content": "Name three colours."}]
N = 12
# One sequence at a time and no prefix cache: the server's engine and those of run-batch and
# generate run the very same steps, so greedy texts are equal (the CPU path for one sequence
# is its own). No timing enters: frames queue behind each other.
FLAGS = (
    "--device", "cpu", "--max-model-len", "256", "--num-kv-blocks", "32",
    "--max-num-seqs", "1", "--no-enable-prefix-caching", "--no-gc-freeze",
)  # fmt: skip


@pytest.fixture
def anyio_backend() -> str:
    """The websockets client runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # scale 0.06: the greedy text changes within a few tokens (as in test_lora_model.py)
    folder = tmp_path_factory.mktemp("lora") / "tiny"
    return raw_adapter(folder, num_layers=30, shapes=SMOLLM2_SHAPES, scale=0.06)


def _config(adapter: Path) -> EngineConfig:
    return EngineConfig(
        device="cpu",
        max_model_len=256,
        num_kv_blocks=32,
        max_num_seqs=1,
        enable_prefix_caching=False,
        gc_freeze=False,
        lora_modules=(f"tiny={adapter}",),
    )


@pytest.fixture(scope="module")
def server(adapter: Path) -> Iterator[ServerThread]:
    """`troupe serve --lora-modules tiny=...` (the engine in its child process)."""
    srv = ServerThread(_config(adapter), GatewaySettings()).start()
    yield srv
    srv.shutdown()


def _post(url: str, path: str, body: object) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _http_text(srv: ServerThread, model: str) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": N, "temperature": 0}
    status, answer = _post(srv.url, "/v1/completions", body)
    assert status == 200, answer
    return str(answer["choices"][0]["text"])


async def _until_end(ws: Any, texts: dict[str, str], ends: dict[str, Any], rid: str) -> None:
    """Read frames (gathering each request's text) until `rid`'s done or error frame."""
    while rid not in ends:
        got = json.loads(await ws.recv())
        if got["type"] == "delta":
            texts[got["request_id"]] = texts.get(got["request_id"], "") + got["text"]
        elif got["type"] in ("done", "error"):
            ends[got["request_id"]] = got


@pytest.mark.anyio
async def test_websocket_frames_run_the_adapter_named_by_model(server: ServerThread) -> None:
    base = server.engine.model_name
    url = server.url.replace("http://", "ws://") + "/v1/ws"
    frame = {"type": "generate", "prompt": PROMPT, "max_tokens": N, "temperature": 0.0}
    texts: dict[str, str] = {}
    ends: dict[str, Any] = {}
    async with connect(url) as ws:
        # an unknown name first: refused by name, and the socket goes on serving
        await ws.send(json.dumps({**frame, "request_id": "unknown", "model": "mysql"}))
        await _until_end(ws, texts, ends, "unknown")
        served = {"adapter": {"model": "tiny"}, "base": {"model": base}, "lora": {"lora": "tiny"}}
        for rid, fields in served.items():
            await ws.send(json.dumps({**frame, **fields, "request_id": rid}))
        for rid in served:
            await _until_end(ws, texts, ends, rid)
    refused = ends["unknown"]
    assert (refused["type"], refused["code"], refused["field"]) == (
        "error",
        "model_not_found",
        "model",
    )
    assert "model 'mysql' does not exist" in refused["message"] and "'tiny'" in refused["message"]
    assert "unknown" not in texts
    assert {rid: ends[rid]["type"] for rid in served} == dict.fromkeys(served, "done")
    assert texts["adapter"] == _http_text(server, "tiny") == texts["lora"]
    assert texts["base"] == _http_text(server, base)
    assert texts["adapter"] != texts["base"], "the adapter changed nothing: is `model` ignored?"


def _line(custom_id: str, url: str, body: Any) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_run_batch_lines_run_the_adapter_named_by_model(
    server: ServerThread, adapter: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = server.engine.model_name
    completion = {"prompt": PROMPT, "max_tokens": N, "temperature": 0}
    chat = {"messages": USER, "max_tokens": N, "temperature": 0}
    requests = {
        "unknown": ("/v1/completions", {**completion, "model": "mysql"}),
        "adapter": ("/v1/completions", {**completion, "model": "tiny"}),
        "base": ("/v1/completions", {**completion, "model": base}),
        "chat-adapter": ("/v1/chat/completions", {**chat, "model": "tiny"}),
        "chat-base": ("/v1/chat/completions", chat),
    }
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(f"{_line(k, *v)}\n" for k, v in requests.items()))
    args = ["run-batch", "-i", str(source), "-o", str(out), "--no-progress", *FLAGS]
    status = main([*args, "--lora-modules", f"tiny={adapter}"])
    assert status == 0, capsys.readouterr().err
    lines = {line["custom_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert list(lines) == list(requests)  # input order, the refused line in its place

    unknown = lines["unknown"]
    assert unknown["response"]["status_code"] == 404
    assert unknown["error"]["code"] == "model_not_found"
    error = unknown["response"]["body"]["error"]
    assert error["param"] == "model" and "model 'mysql' does not exist" in error["message"]
    assert "'tiny'" in error["message"]

    def text(custom_id: str) -> str:
        got = lines[custom_id]
        assert got["error"] is None and got["response"]["status_code"] == 200, got
        choice = got["response"]["body"]["choices"][0]
        return str(choice["text"] if "text" in choice else choice["message"]["content"])

    assert lines["adapter"]["response"]["body"]["model"] == "tiny"
    assert text("adapter") == _http_text(server, "tiny")
    assert text("base") == _http_text(server, base)
    assert text("adapter") != text("base")
    _, http_chat = _post(server.url, "/v1/chat/completions", {**chat, "model": "tiny"})
    assert text("chat-adapter") == http_chat["choices"][0]["message"]["content"]
    assert text("chat-adapter") != text("chat-base")


def test_generate_runs_the_adapter_named_by_lora(
    server: ServerThread, adapter: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["generate", PROMPT, "--max-tokens", str(N), "--temperature", "0", *FLAGS]
    module = {"name": "tiny", "path": str(adapter), "base_model_name": "SmolLM2"}
    modules = ["--lora-modules", json.dumps(module)]  # vLLM's JSON form
    capsys.readouterr()
    assert main([*args, *modules, "--lora", "tiny"]) == 0
    assert capsys.readouterr().out == _http_text(server, "tiny") + "\n"
    assert main([*args, *modules]) == 0
    assert capsys.readouterr().out == _http_text(server, server.engine.model_name) + "\n"


def test_generate_refuses_an_unknown_adapter_before_the_engine_starts(
    adapter: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["generate", PROMPT, "--device", "cpu", "--lora", "mysql"]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--lora-modules", f"tiny={adapter}"])
    assert exited.value.code == 2
    assert "--lora: no adapter named 'mysql'; adapters: tiny" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(args)
    assert "adapters: none: give --lora-modules NAME=PATH" in capsys.readouterr().err
