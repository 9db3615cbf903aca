"""`troupe run-batch`: OpenAI Batch API files through an in-process engine. Every line's body
is the one `troupe serve` answers the same request with over HTTP (fake runner, a LoRA adapter,
structured output, tools, beam search, embeddings, score, rerank, responses; and SmolLM2 on the
CPU), errors included; a line that is no request gets an error line naming its field while the
others run; answers come out in input order; stdin in, stdout out; overloaded lines run again."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from troupe.config import EngineConfig
from troupe.gateway.errors import ApiError
from troupe.gateway.json_calls import JSON_CALLS, Answer
from troupe.gateway.state import GatewaySettings
from troupe.ops.batch_lines import BatchLine, LineReader, OrderedWriter, Refused, output_line
from troupe.ops.cli import build_parser, main
from troupe.ops.run_batch import Flight, Progress, run_batch_command, window_for

from tests.gateway.conftest import BASE_CONFIG, ServerThread

CONFIG = BASE_CONFIG.replace(lora_modules=("sql=/adapters/sql",))
USER = [{"role": "user", "content": "Describe the weather."}]
SCHEMA = {
    "type": "object",
    "properties": {"size": {"enum": ["small", "large"]}, "ok": {"type": "boolean"}},
    "required": ["size", "ok"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
SAMPLED = {"temperature": 1.0, "seed": 3}

# (url, body): one of each answer shape the batch runner serves
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8}),
    "completions-n": (
        "/v1/completions",
        {"prompt": ["a b", "c d"], "n": 2, "max_tokens": 4, "logprobs": 2, **SAMPLED},
    ),
    "beam": (
        "/v1/completions",
        {"prompt": "x y", "use_beam_search": True, "n": 2, "max_tokens": 3},
    ),
    "chat": ("/v1/chat/completions", {"messages": USER, "max_tokens": 8, "temperature": 0}),
    "chat-lora": (
        "/v1/chat/completions",
        {"model": "sql", "messages": USER, "max_tokens": 4, "temperature": 0},
    ),
    "chat-schema": (
        "/v1/chat/completions",
        {
            "messages": USER,
            "max_tokens": 48,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": SCHEMA},
            },
            **SAMPLED,
        },
    ),
    "chat-tool": (
        "/v1/chat/completions",
        {
            "messages": USER,
            "max_tokens": 48,
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            **SAMPLED,
        },
    ),
    "embeddings": ("/v1/embeddings", {"input": ["hello world", "bye"], "encoding_format": "float"}),
    "score": ("/v1/score", {"text_1": "a cat", "text_2": ["a dog", "a car"]}),
    "rerank": ("/rerank", {"query": "pets", "documents": ["cats", "cars"], "top_n": 1}),
    "responses": ("/v1/responses", {"input": "Hi there", "max_output_tokens": 6, "temperature": 0}),
    # refused by the endpoint: the HTTP status and error body
    "bad-temperature": ("/v1/chat/completions", {"messages": USER, "temperature": -1}),
    "unknown-model": ("/v1/completions", {"model": "nope", "prompt": "x"}),
    "no-input": ("/v1/embeddings", {"model": None}),
}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    """`troupe serve` on CONFIG (the engine in its child process)."""
    srv = ServerThread(CONFIG, GatewaySettings()).start()
    yield srv
    srv.shutdown()


def _post(url: str, path: str, body: object) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _line(custom_id: str, url: str, body: Any, method: str = "POST") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


def _run(
    tmp_path: Path, lines: list[str], config: EngineConfig = CONFIG, *flags: str
) -> tuple[int, list[dict[str, Any]]]:
    """Run the batch in this process; the exit status and the output lines."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(f"{line}\n" for line in lines))
    args = ["run-batch", "-i", str(source), "-o", str(out), "--no-progress", *flags]
    status = run_batch_command(build_parser().parse_args(args), config)
    return status, [json.loads(line) for line in out.read_text().splitlines()]


def _stable(body: Any) -> Any:
    """`body` without what differs between two answers to one request: ids and times."""
    if isinstance(body, dict):
        return {k: _stable(v) for k, v in body.items() if k not in ("id", "created", "created_at")}
    if isinstance(body, list):
        return [_stable(v) for v in body]
    return body


def test_every_line_is_answered_as_over_http(server: ServerThread, tmp_path: Path) -> None:
    lines = [_line(name, url, body) for name, (url, body) in REQUESTS.items()]
    status, out = _run(tmp_path, lines)
    assert status == 0
    assert [o["custom_id"] for o in out] == list(REQUESTS)  # input order
    for (name, (url, body)), got in zip(REQUESTS.items(), out, strict=True):
        want_status, want_body = _post(server.url, url, body)
        response = got["response"]
        assert (response["status_code"], _stable(response["body"])) == (
            want_status,
            _stable(want_body),
        ), name
        assert got["id"].startswith("batch_req_")
        if want_status == 200:
            assert got["error"] is None
            if "id" in want_body:  # the engine's request id names the answer
                assert response["request_id"] == response["body"]["id"]
        else:
            error = want_body["error"]
            assert got["error"] == {"code": error["code"], "message": error["message"]}, name
            assert response["request_id"].startswith("req_")
    by_id = {o["custom_id"]: o["response"] for o in out}
    assert by_id["chat-lora"]["body"]["model"] == "sql"
    assert by_id["bad-temperature"]["body"]["error"]["param"] == "temperature"
    assert by_id["unknown-model"]["status_code"] == 404
    assert json.loads(by_id["chat-schema"]["body"]["choices"][0]["message"]["content"])
    calls = by_id["chat-tool"]["body"]["choices"][0]["message"]["tool_calls"]
    assert calls[0]["function"]["name"] == "get_weather"
    assert len(by_id["embeddings"]["body"]["data"][1]["embedding"]) > 0


def test_lines_that_are_no_request_get_error_lines(tmp_path: Path) -> None:
    chat = {"messages": USER, "max_tokens": 2, "temperature": 0}
    lines = [
        "{not json",
        _line("streamed", "/v1/chat/completions", {**chat, "stream": True}),
        _line("unknown-url", "/v1/images/generations", {"prompt": "x"}),
        _line("get", "/v1/chat/completions", chat, method="GET"),
        json.dumps({"custom_id": "no-body", "method": "POST", "url": "/v1/completions"}),
        json.dumps({"custom_id": 7, "method": "POST", "url": "/v1/completions", "body": {}}),
        "",  # blank: skipped, no output line
        _line("ok", "/v1/chat/completions", chat),
        _line("ok", "/v1/chat/completions", chat),  # a custom_id used before
    ]
    status, out = _run(tmp_path, lines)
    assert status == 0
    assert [o["custom_id"] for o in out] == [
        None, "streamed", "unknown-url", "get", "no-body", None, "ok", "ok",
    ]  # fmt: skip
    codes = [(o["response"]["status_code"], o["response"]["body"]["error"]["param"])
             for o in out if o["error"] is not None]  # fmt: skip
    assert codes == [
        (400, None), (400, "stream"), (400, "url"), (400, "method"), (400, "body"),
        (400, "custom_id"), (400, "custom_id"),
    ]  # fmt: skip
    assert out[0]["error"]["code"] == "invalid_json"
    assert "line 1 is not JSON" in out[0]["error"]["message"]
    assert "/v1/images/generations" in out[2]["error"]["message"]
    assert "line 9: custom_id 'ok' is line 8's too" in out[7]["error"]["message"]
    assert out[6]["error"] is None and out[6]["response"]["status_code"] == 200
    for o in out:
        if o["error"] is not None:  # the body is an OpenAI error, as HTTP's
            assert set(o["response"]["body"]["error"]) == {"message", "type", "param", "code"}


def test_answers_come_in_input_order(tmp_path: Path) -> None:
    """The first line runs longest; each line's answer still lands in its place."""
    lengths = [64, 1, 2, 1, 3, 1, 1, 2]
    lines = [
        _line(f"r{i}", "/v1/completions", {"prompt": f"p{i}", "max_tokens": n, "ignore_eos": True})
        for i, n in enumerate(lengths)
    ]
    status, out = _run(tmp_path, lines)
    assert status == 0
    assert [o["custom_id"] for o in out] == [f"r{i}" for i in range(len(lengths))]
    got = [o["response"]["body"]["usage"]["completion_tokens"] for o in out]
    assert got == lengths


def test_the_ordered_writer_holds_answers_until_their_turn() -> None:
    written: list[bytes] = []
    writer = OrderedWriter(written.append, lambda: None)
    for index in (2, 1):
        writer.put(index, b"%d" % index)
    assert (written, writer.num_held) == ([], 2)
    writer.put(0, b"0")
    assert written == [b"0", b"1", b"2"]
    writer.put(4, b"4")
    assert (written[-1], writer.num_written, writer.num_held) == (b"2", 3, 1)
    with pytest.raises(AssertionError, match="line 1 twice"):
        writer.put(1, b"again")


def test_line_reader_names_the_field() -> None:
    reader = LineReader(JSON_CALLS)
    got = reader.read(b'{"custom_id": "a", "method": "POST", "body": {}}', 4)
    assert isinstance(got, Refused) and got.custom_id == "a"
    assert got.answer.body["error"]["param"] == "url"
    assert "line 4" in got.answer.body["error"]["message"]
    got = reader.read(b"[1, 2]", 5)
    assert isinstance(got, Refused) and got.answer.body["error"]["param"] is None
    line = reader.read(
        b'{"custom_id": "a", "method": "POST", "url": "/score", "body": {"x": 1}}', 6
    )
    assert not isinstance(line, Refused) and bytes(line.body) == b'{"x": 1}'  # as written
    ok = output_line("a", Answer(status=200, body={"id": "cmpl-1", "choices": []}))
    assert json.loads(ok)["response"] == {
        "status_code": 200, "request_id": "cmpl-1", "body": {"id": "cmpl-1", "choices": []},
    }  # fmt: skip


def test_stdin_in_stdout_out_through_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        _line("one", "/v1/completions", {"prompt": "hi", "max_tokens": 3}),
        "oops",
        _line("two", "/v1/embeddings", {"input": "hello"}),
    ]
    data = "".join(f"{line}\n" for line in lines).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    flags = ["--runner", "fake", "--device", "cpu", "--num-kv-blocks", "256", "--no-gc-freeze"]
    status = main(["run-batch", "-i", "-", "-o", "-", "--no-progress", *flags])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    out = [json.loads(line) for line in captured.out.splitlines()]
    assert [o["custom_id"] for o in out] == ["one", None, "two"]
    assert [o["response"]["status_code"] for o in out] == [200, 400, 200]
    assert out[0]["response"]["body"]["usage"]["completion_tokens"] == 3
    assert "run-batch: 3 lines, 2 answered, 1 failed, " in captured.err
    assert "-> -" in captured.err


def test_urls_and_missing_files_are_refused_before_the_engine_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out.jsonl")
    assert main(["run-batch", "-i", "https://example.com/in.jsonl", "-o", out]) == 2
    assert "fetch it first" in capsys.readouterr().err
    assert main(["run-batch", "-i", str(tmp_path / "missing.jsonl"), "-o", out]) == 2
    assert "cannot open" in capsys.readouterr().err


def test_overloaded_lines_run_again_and_one_that_never_fits_is_429(tmp_path: Path) -> None:
    """Two engine requests fill this engine (one running, one queued): a line of two prompts
    beside a line of one overloads it, and the line turned away runs once the other is done
    (test_an_overloaded_line_waits_for_another_to_finish checks the waiting step by step). A
    line of three prompts never fits: alone, its 429 stands."""
    config = CONFIG.replace(max_num_seqs=1, max_queued_requests=1)
    assert window_for(config) == 2
    body = {"max_tokens": 6, "ignore_eos": True}
    lines = [
        _line("two", "/v1/completions", {**body, "prompt": ["a", "b"], "max_tokens": 200}),
        _line("one", "/v1/completions", {**body, "prompt": "c"}),
        _line("also-one", "/v1/completions", {**body, "prompt": "d"}),
        _line("three", "/v1/completions", {**body, "prompt": ["e", "f", "g"], "max_tokens": 64}),
    ]
    status, out = _run(tmp_path, lines, config)
    assert status == 0
    assert [o["response"]["status_code"] for o in out] == [200, 200, 200, 429]
    assert out[3]["error"]["code"] == "overloaded"
    assert [len(o["response"]["body"]["choices"]) for o in out[:3]] == [2, 1, 1]


def test_an_overloaded_line_waits_for_another_to_finish() -> None:
    overloaded = Answer(status=429, body=ApiError(429, "full", code="overloaded").body())
    ok = Answer(status=200, body={"id": "cmpl-1"})
    asked: list[str] = []
    a_may_finish = asyncio.Event()

    async def ask(line: BatchLine) -> Answer:
        asked.append(line.custom_id)
        if line.custom_id == "a":
            await a_may_finish.wait()
            return ok
        if line.custom_id == "lone" or asked == ["a", "b"]:
            return overloaded  # "b" the first time
        return ok

    def line(custom_id: str) -> BatchLine:
        return BatchLine(custom_id, "POST", "/v1/completions", msgspec.Raw(b"{}"))

    async def main() -> None:
        progress = Progress(is_shown=False)
        flight = Flight(ask, progress)
        a = asyncio.create_task(flight.answer(line("a")))
        b = asyncio.create_task(flight.answer(line("b")))
        for _ in range(100):  # until "b" was turned away and waits
            if progress.num_retries:
                break
            await asyncio.sleep(0)
        assert (asked, progress.num_retries, b.done()) == (["a", "b"], 1, False)
        a_may_finish.set()
        assert (await a, await b) == (ok, ok)
        assert asked == ["a", "b", "b"]
        assert await flight.answer(line("lone")) == overloaded  # nothing else runs: it stands
        assert (asked[-1], progress.num_retries) == ("lone", 1)

    asyncio.run(main())


# The real default model: one sequence at a time and no prefix cache, so the batch's engine
# and the server's run the very same steps (the CPU path for one sequence is its own).
SMOL = EngineConfig(
    device="cpu", max_model_len=256, num_kv_blocks=32, max_num_seqs=1,
    enable_prefix_caching=False, gc_freeze=False,
)  # fmt: skip


def test_smollm2_answers_as_over_http(tmp_path: Path) -> None:
    requests = {
        "completion": ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6}),
        "chat": (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 6,
                "temperature": 0,
            },
        ),
        "embeddings": (
            "/v1/embeddings",
            {"input": "Embeddings map text", "encoding_format": "float"},
        ),
    }
    lines = [_line(name, url, body) for name, (url, body) in requests.items()]
    status, out = _run(tmp_path, lines, SMOL)
    assert status == 0
    srv = ServerThread(SMOL, GatewaySettings()).start()
    try:
        for (name, (url, body)), got in zip(requests.items(), out, strict=True):
            want_status, want_body = _post(srv.url, url, body)
            assert want_status == got["response"]["status_code"] == 200, (name, got)
            assert _stable(got["response"]["body"]) == _stable(want_body), name
    finally:
        srv.shutdown()
    assert out[0]["response"]["body"]["choices"][0]["text"].strip()  # real words
