"""Stored responses with the official `openai` client against a fake-runner server that keeps
three: a conversation continued with previous_response_id runs on the whole conversation (the
prompt chat renders for it, token for token, without the first turn's instructions), GET gives
the create answer back (whole or streamed), input_items pages as OpenAI's lists do, DELETE then
404, the oldest is evicted at the bound, store false and a server without a store keep nothing,
and an answer whose client went away is not stored."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner
from troupe.messages import Aborted, StreamEvent

from tests.gateway.conftest import BASE_CONFIG, ServerThread, open_post, openai_client

GREEDY: dict[str, Any] = {"model": "", "temperature": 0, "max_output_tokens": 8}
NUM_KEPT = 3
INSTRUCTIONS = "Answer in one short line, in the style of a ship's log, and never use numbers."


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerThread]:
    settings = GatewaySettings(engine_process=False, max_stored_responses=NUM_KEPT)
    runner = FakeRunner.from_config(BASE_CONFIG)
    started = ServerThread(BASE_CONFIG, settings, runner=runner).start()
    yield started
    started.shutdown()


@pytest.fixture(scope="module")
def client(srv: ServerThread) -> OpenAI:
    return openai_client(srv.url)


def _http(url: str, method: str = "GET", body: object = None) -> tuple[int, Any]:
    """(status, JSON body) of a request; an SSE answer as its list of event data."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    if text.startswith("event:"):
        blocks = [b.split("data: ", 1)[1] for b in text.split("\n\n") if "data: " in b]
        return status, [json.loads(b) for b in blocks]
    return status, json.loads(text)


def test_a_conversation_continues_from_the_stored_turn(client: OpenAI) -> None:
    first = client.responses.create(instructions=INSTRUCTIONS, input="Name a color.", **GREEDY)
    second = client.responses.create(
        input="And another one?", previous_response_id=first.id, **GREEDY
    )
    assert second.previous_response_id == first.id and first.previous_response_id is None
    # chat on the conversation written out: the first turn and its answer, not its instructions
    chat = client.chat.completions.create(
        model="",
        messages=[
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And another one?"},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert second.usage is not None and chat.usage is not None and first.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content
    alone = client.responses.create(input="And another one?", **GREEDY)
    assert alone.usage is not None
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    # a third turn continues the second: the whole conversation, with its own instructions
    third = client.responses.create(
        instructions=INSTRUCTIONS, input="Thanks.", previous_response_id=second.id, **GREEDY
    )
    written = client.responses.create(
        instructions=INSTRUCTIONS,
        input=[
            {"role": "user", "content": "Name a color."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And another one?"},
            {"role": "assistant", "content": second.output_text},
            {"role": "user", "content": "Thanks."},
        ],
        **GREEDY,
    )
    assert third.usage is not None and written.usage is not None
    assert third.usage.input_tokens == written.usage.input_tokens
    assert third.output_text == written.output_text


def test_retrieve_gives_the_create_answer_back(client: OpenAI, srv: ServerThread) -> None:
    status, made = _http(f"{srv.url}/v1/responses", "POST", {"input": "Hello", **GREEDY})
    assert status == 200 and made["id"].startswith("resp_")
    assert _http(f"{srv.url}/v1/responses/{made['id']}") == (200, made)
    text = made["output"][0]["content"][0]["text"]
    assert client.responses.retrieve(made["id"]).output_text == text
    status, events = _http(
        f"{srv.url}/v1/responses", "POST", {"input": "Tell me a story", "stream": True, **GREEDY}
    )
    assert status == 200 and events[-1]["type"] == "response.completed"
    final = events[-1]["response"]
    assert _http(f"{srv.url}/v1/responses/{final['id']}") == (200, final)
    status, error = _http(f"{srv.url}/v1/responses/{final['id']}?stream=true")
    assert status == 400 and error["error"]["param"] == "stream"


def test_input_items_page_through_the_whole_context(client: OpenAI, srv: ServerThread) -> None:
    turns = [
        {"role": "user" if k % 2 == 0 else "assistant", "content": f"turn {k}"} for k in range(5)
    ]
    first = client.responses.create(input=turns, **GREEDY)  # type: ignore[arg-type]
    second = client.responses.create(input="turn 6", previous_response_id=first.id, **GREEDY)
    pages = client.responses.input_items.list(second.id, limit=2, order="asc")
    items = list(pages)  # the client follows `after` from page to page
    texts = [item.content[0].text for item in items]  # type: ignore[union-attr]
    assert texts == [*(t["content"] for t in turns), first.output_text, "turn 6"]
    assert len({item.id for item in items}) == len(items) == 7
    assert items[5].id == first.output[0].id  # the earlier output as it was
    status, page = _http(f"{srv.url}/v1/responses/{second.id}/input_items?limit=3")  # desc
    assert status == 200 and page["object"] == "list" and page["has_more"] is True
    assert [i["id"] for i in page["data"]] == [i.id for i in items[::-1][:3]]
    assert (page["first_id"], page["last_id"]) == (items[6].id, items[4].id)
    assert page["data"][0]["content"] == [{"type": "input_text", "text": "turn 6"}]
    after = f"{srv.url}/v1/responses/{second.id}/input_items?after={items[1].id}&order=asc"
    status, rest = _http(f"{after}&limit=100")
    assert [i["id"] for i in rest["data"]] == [i.id for i in items[2:]] and not rest["has_more"]
    for query, param in [("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"),
                         ("order=up", "order"), ("after=msg_nope", "after")]:  # fmt: skip
        status, error = _http(f"{srv.url}/v1/responses/{second.id}/input_items?{query}")
        assert (status, error["error"]["param"]) == (400, param), query


def test_delete_then_404(client: OpenAI, srv: ServerThread) -> None:
    made = client.responses.create(input="Hi", **GREEDY)
    url = f"{srv.url}/v1/responses/{made.id}"
    assert _http(url, "DELETE") == (200, {"id": made.id, "object": "response", "deleted": True})
    for method, path in [("GET", ""), ("DELETE", ""), ("GET", "/input_items")]:
        status, error = _http(url + path, method)
        assert status == 404 and made.id in error["error"]["message"], (method, path)
        assert error["error"]["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(input="Again", previous_response_id=made.id, **GREEDY)
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert caught.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
    client.responses.delete(client.responses.create(input="Bye", **GREEDY).id)  # the client's


def test_the_oldest_is_evicted_at_the_bound(client: OpenAI, srv: ServerThread) -> None:
    made = [client.responses.create(input=f"Note {k}", **GREEDY).id for k in range(NUM_KEPT + 1)]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made[0])
    assert [client.responses.retrieve(i).id for i in made[1:]] == made[1:]
    with pytest.raises(openai.BadRequestError, match="not found"):
        client.responses.create(input="More", previous_response_id=made[0], **GREEDY)
    assert srv.gateway.responses.statistics().num_entries == NUM_KEPT


def test_store_false_and_duplicate_items(client: OpenAI) -> None:
    kept = client.responses.create(input="Keep me", **GREEDY)
    unkept = client.responses.create(input="Forget me", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    later = client.responses.create(
        input="Go on", previous_response_id=kept.id, store=False, **GREEDY
    )  # continuing does not need storing
    assert later.previous_response_id == kept.id
    echoed = [item.model_dump(exclude_none=True) for item in kept.output]
    with pytest.raises(openai.BadRequestError) as caught:  # the earlier output sent again
        client.responses.create(input=echoed, previous_response_id=kept.id, **GREEDY)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "input[0].id"  # type: ignore[index]


def test_a_server_without_a_store_ignores_store(server: ServerThread) -> None:
    client = openai_client(server.url)
    made = client.responses.create(input="Hi", store=True, **GREEDY)
    with pytest.raises(openai.NotFoundError, match="max-stored-responses"):
        client.responses.retrieve(made.id)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(input="Again", previous_response_id=made.id, **GREEDY)
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]


@pytest.mark.parametrize("stream", [True, False])
def test_an_answer_whose_client_went_away_is_not_stored(stream: bool) -> None:
    runner = FaultyRunner(FakeRunner.from_config(BASE_CONFIG))
    settings = GatewaySettings(engine_process=False, max_stored_responses=NUM_KEPT)
    srv = ServerThread(BASE_CONFIG, settings, runner=runner).start()
    try:
        ends: list[StreamEvent] = []
        lock = threading.Lock()

        def on_event(event: StreamEvent, _: float) -> None:
            if event.is_terminal:
                with lock:
                    ends.append(event)

        srv.engine.add_event_listener(on_event)
        runner.hold_after(3)  # the request cannot end before its client hangs up
        body = {"input": "x", "max_output_tokens": 200, "ignore_eos": True, "stream": stream}
        sock = open_post(srv.url, "/v1/responses", body)
        assert runner.wait_until_held(60)
        sock.close()
        _until(lambda: srv.gateway.num_streams == 0)
        runner.release()
        _until(lambda: ends)
        (end,) = ends
        assert isinstance(end, Aborted)
        assert srv.gateway.responses.statistics().num_entries == 0
        assert _http(f"{srv.url}/v1/responses/{end.request_id}")[0] == 404
    finally:
        runner.release()
        srv.shutdown()


def _until(done: Any) -> None:
    deadline = time.monotonic() + 60  # a hang detector only
    while not done():
        assert time.monotonic() < deadline, "hung"
        time.sleep(0.01)
