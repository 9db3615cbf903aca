"""GET /v1/ws with the `websockets` client: multiplexing, cancel, malformed frames, close."""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

pytestmark = pytest.mark.anyio


async def send(ws: ClientConnection, frame: dict[str, Any]) -> None:
    await ws.send(json.dumps(frame))


def _ws_url(server) -> str:  # type: ignore[no-untyped-def]
    return str(server.url).replace("http://", "ws://") + "/v1/ws"


async def _until_terminal(ws: ClientConnection, ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Frames per request id (and None for socket-level errors) until each id has ended."""
    frames: dict[Any, list[dict[str, Any]]] = {}
    open_ids = set(ids)
    while open_ids:
        frame = json.loads(await ws.recv())
        frames.setdefault(frame["request_id"], []).append(frame)
        if frame["type"] in ("done", "error"):
            open_ids.discard(frame["request_id"])
    return frames


def _check_one_terminal(frames: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = [f["type"] for f in frames]
    assert kinds[:-1] == ["delta"] * (len(kinds) - 1) and kinds[-1] in ("done", "error"), kinds
    return frames[-1]


async def test_two_requests_multiplexed(server) -> None:  # type: ignore[no-untyped-def]
    async with connect(_ws_url(server)) as ws:
        await send(
            ws,
            {
                "type": "generate",
                "request_id": "r1",
                "prompt": "Hello",
                "max_tokens": 5,
                "temperature": 0.0,
                "ignore_eos": True,
            },
        )
        await send(
            ws,
            {
                "type": "generate",
                "request_id": "r2",
                "max_tokens": 7,
                "messages": [{"role": "user", "content": "Hi"}],
                "temperature": 0.0,
                "ignore_eos": True,
            },
        )
        frames = await _until_terminal(ws, {"r1", "r2"})
    for rid, n in (("r1", 5), ("r2", 7)):
        done = _check_one_terminal(frames[rid])
        assert done["type"] == "done" and done["finish_reason"] == "length"
        assert done["usage"]["completion_tokens"] == n
        assert sum(len(f["token_ids"]) for f in frames[rid][:-1]) == n
        phases = {"queue", "prefill", "decode", "inference"}  # vLLM's, as on /metrics
        assert set(done["timings"]) == {"ttft", "tpot", "e2e", *phases}
        assert done["timings"]["e2e"] > 0
    assert set(frames) == {"r1", "r2"}


async def test_cancel(server) -> None:  # type: ignore[no-untyped-def]
    async with connect(_ws_url(server)) as ws:
        await send(
            ws,
            {
                "type": "generate",
                "request_id": "long",
                "prompt": "Go",
                "max_tokens": 900,
                "ignore_eos": True,
            },
        )
        first = json.loads(await ws.recv())
        assert (first["type"], first["request_id"]) == ("delta", "long")
        await send(ws, {"type": "cancel", "request_id": "long"})
        frames = [first, *(await _until_terminal(ws, {"long"}))["long"]]
        done = _check_one_terminal(frames)
        assert (done["type"], done["finish_reason"]) == ("done", "abort")
        assert done["usage"]["completion_tokens"] == sum(len(f["token_ids"]) for f in frames[:-1])
        assert done["usage"]["prompt_tokens"] >= 1  # the engine's own Aborted event, full usage
        assert 0 < done["timings"]["ttft"] <= done["timings"]["e2e"]
        num_streamed = sum(len(f["token_ids"]) for f in frames[:-1])
        assert 1 <= num_streamed < 900
        # The socket goes on after a cancel, and an ended request's id may be used again.
        await send(
            ws,
            {
                "type": "generate",
                "request_id": "long",
                "prompt": "x",
                "max_tokens": 2,
                "ignore_eos": True,
            },
        )
        assert _check_one_terminal((await _until_terminal(ws, {"long"}))["long"])["type"] == "done"
    server.wait_idle()


async def test_malformed_frames_get_errors_and_the_socket_goes_on(server) -> None:  # type: ignore[no-untyped-def]
    async with connect(_ws_url(server)) as ws:
        await ws.send("this is not json")
        assert _error(await ws.recv()) == (None, "invalid_request", None)
        await ws.send(json.dumps([1, 2]))
        assert _error(await ws.recv()) == (None, "invalid_request", None)
        await send(ws, {"type": "generate", "prompt": "x"})
        assert _error(await ws.recv()) == (None, "invalid_request", "request_id")
        await send(ws, {"type": "launch", "request_id": "a"})
        assert _error(await ws.recv()) == ("a", "invalid_request", "type")
        await send(ws, {"type": "generate", "request_id": "b"})
        assert _error(await ws.recv()) == ("b", "invalid_request", "prompt")
        await send(ws, {"type": "generate", "request_id": "c", "prompt": "x", "temperature": "hot"})
        assert _error(await ws.recv()) == ("c", "invalid_request", "temperature")
        await send(ws, {"type": "generate", "request_id": "d", "prompt": "x", "frobnicate": 1})
        assert _error(await ws.recv()) == ("d", "invalid_request", "frobnicate")
        await ws.send(b"\x00binary")
        assert _error(await ws.recv()) == (None, "invalid_request", None)
        await send(ws, {"type": "cancel", "request_id": "never-started"})  # ignored
        await send(
            ws,
            {
                "type": "generate",
                "request_id": "ok",
                "prompt": "x",
                "max_tokens": 3,
                "ignore_eos": True,
            },
        )
        done = _check_one_terminal((await _until_terminal(ws, {"ok"}))["ok"])
        assert (done["type"], done["usage"]["completion_tokens"]) == ("done", 3)


async def test_closing_the_socket_aborts_its_requests(server) -> None:  # type: ignore[no-untyped-def]
    async with connect(_ws_url(server)) as ws:
        for i in range(3):
            await send(
                ws,
                {
                    "type": "generate",
                    "request_id": f"q{i}",
                    "prompt": "x",
                    "max_tokens": 900,
                    "ignore_eos": True,
                },
            )
        assert json.loads(await ws.recv())["type"] == "delta"
    server.wait_idle()


def _error(raw: str | bytes) -> tuple[Any, str, Any]:
    frame = json.loads(raw)
    assert frame["type"] == "error" and frame["message"], frame
    return frame["request_id"], frame["code"], frame.get("field")


async def test_prompt_logprobs_and_embedding_ride_the_first_delta(server) -> None:  # type: ignore[no-untyped-def]
    prompt = [5, 17, 42, 99, 3, 250, 7]
    async with connect(_ws_url(server)) as ws:
        frame = {"type": "generate", "prompt": prompt, "max_tokens": 3, "ignore_eos": True}
        await send(ws, {**frame, "request_id": "s", "prompt_logprobs": 2})
        await send(ws, {**frame, "request_id": "e", "pooling": {"type": "mean"}})
        await send(ws, {**frame, "request_id": "p"})
        frames = await _until_terminal(ws, {"s", "e", "p"})
    first, *rest = frames["s"][:-1]
    assert [row[0] for row in first["prompt_logprobs"]] == prompt[1:]
    assert all(len(row[2]) == 2 for row in first["prompt_logprobs"])
    assert "embedding" not in first
    assert all("prompt_logprobs" not in f for f in rest)
    first, *rest = frames["e"][:-1]
    assert len(first["embedding"]) > 0 and "prompt_logprobs" not in first
    assert all("embedding" not in f for f in rest)
    assert all("embedding" not in f and "prompt_logprobs" not in f for f in frames["p"])
