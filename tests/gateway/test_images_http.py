"""Chat image parts over HTTP (the engine in its child process: the bytes cross the process
boundary): a data URL and the same PNG fetched from an http URL both give transformers'
greedy tokens for a tiny random LLaVA; a fetch that fails, a body too large, a host not
allowed and a fetch that does not arrive are 400s naming the part's url."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from troupe.config import EngineConfig
from troupe.gateway.errors import ApiError
from troupe.gateway.image_fetch import fetch_images
from troupe.gateway.state import GatewaySettings
from troupe.messages import ChatMessage, ChatPart

from tests.gateway.conftest import ServerThread, post_json
from tests.gpu.test_llava_images import NUM_NEW, _hf_greedy, _png, tiny_llava

pytestmark = pytest.mark.slow
IMAGE = _png(7)
BIG = _png(8, (120, 120))  # ~43 kB of noise: over the server's max_media_bytes


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = {"/cat.png": IMAGE, "/big.png": BIG}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    return tiny_llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def srv(llava: tuple[Path, Any, Any]) -> Iterator[ServerThread]:
    config = EngineConfig(
        model=str(llava[0]), device="cpu", max_model_len=128, num_kv_blocks=64, block_size=4,
        gc_freeze=False,
    )  # fmt: skip
    server = ServerThread(config, GatewaySettings(max_media_bytes=20_000)).start()
    yield server
    server.shutdown()


def _chat(srv: ServerThread, url: str) -> tuple[int, dict[str, Any]]:
    body = {
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "w5 w6"},
        ]}],
        "max_tokens": NUM_NEW, "temperature": 0, "ignore_eos": True, "logprobs": True,
        "return_tokens_as_token_ids": True,
    }  # fmt: skip
    status, answer = post_json(srv.url, "/v1/chat/completions", body)
    return status, answer


def _ids(answer: dict[str, Any]) -> list[int]:
    content = answer["choices"][0]["logprobs"]["content"]
    return [int(entry["token"].removeprefix("token_id:")) for entry in content]


def test_data_and_http_urls_give_transformers_tokens(
    srv: ServerThread, llava: tuple[Path, Any, Any], image_server: str
) -> None:
    want = _hf_greedy(llava, (IMAGE, "w5 w6"))
    inline = "data:image/png;base64," + base64.b64encode(IMAGE).decode()
    for url in (inline, f"{image_server}/cat.png"):
        status, answer = _chat(srv, url)
        assert status == 200, answer
        assert _ids(answer) == want


def test_fetch_failures_name_the_url(srv: ServerThread, image_server: str) -> None:
    field = "messages[0].content[0].image_url.url"
    for path, words in (("/nothing.png", "answered 404"), ("/big.png", "over 20000 bytes")):
        status, answer = _chat(srv, f"{image_server}{path}")
        assert status == 400 and answer["error"]["param"] == field, answer
        assert words in answer["error"]["message"]


def _message(url: str) -> ChatMessage:
    return ChatMessage(role="user", content="", parts=(ChatPart(type="image", url=url),))


@pytest.mark.anyio
async def test_hosts_and_deadlines(image_server: str) -> None:
    allowed = GatewaySettings(allowed_media_domains=("images.example",))
    with pytest.raises(ApiError, match="not among allowed_media_domains") as info:
        await fetch_images([_message(f"{image_server}/cat.png")], allowed)
    assert info.value.param == "messages[0].content[0].image_url.url"
    # a server that takes the connection and never answers: the deadline ends the wait
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    quick = GatewaySettings(media_fetch_timeout=0.2)
    with pytest.raises(ApiError, match=r"did not arrive in 0\.2 s"):
        await fetch_images([_message(f"http://127.0.0.1:{port}/slow.png")], quick)
    await listener.aclose()
    # fetched bytes take the URL's place; other parts stay as they were
    plain = ChatMessage(role="user", content="hi")
    got = await fetch_images([plain, _message(f"{image_server}/cat.png")], GatewaySettings())
    assert got[0] is plain and got[1].parts == (ChatPart(type="image", image=IMAGE),)


def test_responses_input_image(srv: ServerThread, image_server: str) -> None:
    """/v1/responses' input_image (an http URL, fetched) answers what chat answers."""
    status, chat = _chat(srv, f"{image_server}/cat.png")
    assert status == 200, chat
    content = [{"type": "input_image", "image_url": f"{image_server}/cat.png"},
               {"type": "input_text", "text": "w5 w6"}]  # fmt: skip
    body = {"input": [{"role": "user", "content": content}], "max_output_tokens": NUM_NEW,
            "temperature": 0, "store": False}  # fmt: skip
    status, answer = post_json(srv.url, "/v1/responses", body)
    assert status == 200, answer
    text = answer["output"][-1]["content"][0]["text"]
    assert text == chat["choices"][0]["message"]["content"]
    content[0] = {"type": "input_image", "image_url": "ftp://x"}
    status, answer = post_json(srv.url, "/v1/responses", body)
    assert status == 400 and answer["error"]["param"] == "input[0].content[0].image_url.url"


def test_anthropic_image_blocks(srv: ServerThread, image_server: str) -> None:
    """/v1/messages' image blocks (base64 data, or a URL fetched) answer what chat answers;
    data that is no base64 is a 400 naming the block's source."""
    status, chat = _chat(srv, f"{image_server}/cat.png")
    assert status == 200, chat
    sources = [
        {"type": "base64", "media_type": "image/png", "data": base64.b64encode(IMAGE).decode()},
        {"type": "url", "url": f"{image_server}/cat.png"},
    ]
    for source in sources:
        blocks = [{"type": "image", "source": source}, {"type": "text", "text": "w5 w6"}]
        body = {"model": Path(srv.config.model).name, "max_tokens": NUM_NEW, "temperature": 0,
                "messages": [{"role": "user", "content": blocks}]}  # fmt: skip
        status, answer = post_json(srv.url, "/v1/messages", body)
        assert status == 200, answer
        assert answer["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    blocks[0] = {"type": "image", "source": {"type": "base64", "data": "@@"}}
    status, answer = post_json(srv.url, "/v1/messages", body)
    assert status == 400 and "messages[0].content[0].source.data" in answer["error"]["message"]


def test_websocket_image_urls(srv: ServerThread, image_server: str) -> None:
    """A websocket frame's image part: fetched from its URL, it answers what chat answers; a
    URL that fails is an error frame naming the part."""
    from websockets.sync.client import connect

    status, chat = _chat(srv, f"{image_server}/cat.png")
    assert status == 200, chat
    want = _ids(chat)

    def frame(request_id: str, url: str) -> str:
        content = [{"type": "image_url", "image_url": {"url": url}},
                   {"type": "text", "text": "w5 w6"}]  # fmt: skip
        return json.dumps({"type": "generate", "request_id": request_id, "max_tokens": NUM_NEW,
                           "temperature": 0, "ignore_eos": True,
                           "messages": [{"role": "user", "content": content}]})  # fmt: skip

    with connect(srv.url.replace("http://", "ws://") + "/v1/ws") as ws:
        ws.send(frame("good", f"{image_server}/cat.png"))
        ws.send(frame("bad", f"{image_server}/nothing.png"))
        got: list[int] = []
        ends: dict[str, dict[str, Any]] = {}
        while len(ends) < 2:
            message = json.loads(ws.recv(timeout=120))
            if message["type"] == "delta":
                got += message["token_ids"]
            else:
                ends[message["request_id"]] = message
    assert ends["good"]["type"] == "done" and got == want, ends
    assert ends["bad"]["type"] == "error", ends
    assert ends["bad"]["field"] == "messages[0].content[0].image_url.url"


def test_beam_search_refuses_images(srv: ServerThread) -> None:
    """Beam search's rounds run on token ids: an image part is named, not lost."""
    url = "data:image/png;base64," + base64.b64encode(IMAGE).decode()
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "w5"}, {"type": "image_url", "image_url": {"url": url}},
    ]}], "use_beam_search": True, "n": 2, "max_tokens": 2}  # fmt: skip
    status, answer = post_json(srv.url, "/v1/chat/completions", body)
    assert status == 400 and answer["error"]["param"] == "messages[0].content[1]", answer
