"""Background responses (`background: true`), with the official `openai` client and raw HTTP,
against a fake-runner server that stores responses. A FaultyRunner holds a request's steps, so
a response is certainly still running when it is cancelled, followed or shut down: no test
depends on how fast the machine is (loops below only detect a hang).

The create call answers at once ("queued"); retrieve shows it run to the same answer as a
foreground call; cancel aborts the engine's request (its one terminal event an Aborted, its
blocks freed) and answers "cancelled" (again when repeated); a finished or foreground response
is not cancelled; GET of a running one shows its output so far; GET ?stream=true replays the
events, and follows a running response live;
shutdown ends a running one with its request aborted; no more run at once than the store holds
(one more is a 429), and a streamed background create follows its run to the end."""

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

from tests.gateway.conftest import BASE_CONFIG, ServerThread, openai_client

HANG = 60  # s: a hang detector only
GREEDY: dict[str, Any] = {"model": "", "temperature": 0, "max_output_tokens": 8}
LONG: dict[str, Any] = {"model": "", "max_output_tokens": 200, "extra_body": {"ignore_eos": True}}
SETTINGS = GatewaySettings(engine_process=False, max_stored_responses=8)


class Ends:
    """The terminal engine events of /v1/responses requests, by request id."""

    def __init__(self, srv: ServerThread) -> None:
        self._lock = threading.Lock()
        self.events: dict[str, list[StreamEvent]] = {}
        srv.engine.add_event_listener(self._on_event)

    def _on_event(self, event: StreamEvent, _: float) -> None:
        if event.request_id.startswith("resp_") and event.is_terminal:
            with self._lock:
                self.events.setdefault(event.request_id, []).append(event)

    def of(self, request_id: str) -> list[StreamEvent]:
        _until(lambda: request_id in self.events)
        with self._lock:
            return list(self.events[request_id])


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerThread]:
    runner = FaultyRunner(FakeRunner.from_config(BASE_CONFIG))
    started = ServerThread(BASE_CONFIG, SETTINGS, runner=runner).start()
    yield started
    runner.release()
    started.shutdown()


@pytest.fixture(scope="module")
def ends(srv: ServerThread) -> Ends:
    return Ends(srv)


@pytest.fixture
def held(srv: ServerThread) -> Iterator[FaultyRunner]:
    """The server's runner, holding steps after the next two until the test ends."""
    runner: FaultyRunner = srv.runner
    runner.hold_after(2)
    yield runner
    runner.release()


@pytest.fixture(scope="module")
def client(srv: ServerThread) -> OpenAI:
    return openai_client(srv.url)


def _until(done: Any) -> None:
    deadline = time.monotonic() + HANG
    while not done():
        assert time.monotonic() < deadline, "hung"
        time.sleep(0.01)


def _http(url: str, method: str = "GET", body: object = None) -> tuple[int, Any]:
    """(status, JSON body) of a request; an SSE answer as its list of event data."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=HANG) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    if text.startswith("event:"):
        blocks = [b.split("data: ", 1)[1] for b in text.split("\n\n") if "data: " in b]
        return status, [json.loads(b) for b in blocks]
    return status, json.loads(text)


def _wait_held(runner: FaultyRunner, num_held_before: int) -> None:
    assert runner.wait_until_held(HANG, num_held=num_held_before + 1)


def test_a_background_response_runs_to_the_foreground_answer(
    client: OpenAI, srv: ServerThread
) -> None:
    created = client.responses.create(input="Name a planet.", background=True, **GREEDY)
    assert created.background is True and created.status in ("queued", "in_progress")
    assert created.output == [] and created.usage is None
    # the live stream ends when the run does: then the stored object is the whole one
    events = list(client.responses.retrieve(created.id, stream=True))
    assert events[-1].type == "response.completed"
    done = client.responses.retrieve(created.id)
    foreground = client.responses.create(input="Name a planet.", **GREEDY)
    assert done.status == foreground.status != "in_progress" and done.background is True
    assert done.output_text == foreground.output_text and done.output_text
    assert done.usage is not None and foreground.usage is not None
    assert done.usage.output_tokens == foreground.usage.output_tokens
    assert events[-1].response.output_text == done.output_text
    # a finished one: replayed from the store, after a sequence number
    status, replayed = _http(f"{srv.url}/v1/responses/{created.id}?stream=true&starting_after=1")
    assert status == 200
    assert [e["sequence_number"] for e in replayed] == [e.sequence_number for e in events[2:]]
    assert replayed[-1]["response"] == _http(f"{srv.url}/v1/responses/{created.id}")[1]
    # cancelling a finished one is refused with its status
    with pytest.raises(openai.BadRequestError, match=f"is {done.status}"):
        client.responses.cancel(created.id)


def test_cancel_aborts_the_running_request(
    client: OpenAI, srv: ServerThread, held: FaultyRunner, ends: Ends
) -> None:
    num_held = held.num_held
    created = client.responses.create(input="Tell a long story.", background=True, **LONG)
    _wait_held(held, num_held)  # its next step waits: it cannot end by itself
    assert client.responses.retrieve(created.id).status == "in_progress"
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.id == created.id
    assert client.responses.retrieve(created.id).status == "cancelled"
    assert client.responses.cancel(created.id).status == "cancelled"  # idempotent, as OpenAI's
    held.release()
    (end,) = ends.of(created.id)
    assert isinstance(end, Aborted), end
    srv.wait_idle()  # no request left, every block back
    assert srv.engine.stats().num_gpu_blocks_used == 0
    status, replayed = _http(f"{srv.url}/v1/responses/{created.id}?stream=true")
    assert status == 200 and replayed[0]["type"] == "response.created"
    assert (replayed[-1]["type"], replayed[-1]["code"]) == ("error", "response_cancelled")


def test_a_follower_gets_the_events_so_far_then_live_ones(
    client: OpenAI, srv: ServerThread, held: FaultyRunner
) -> None:
    num_held = held.num_held
    body = {**GREEDY, "max_output_tokens": 12}
    created = client.responses.create(input="Count sheep.", background=True, **body)
    _wait_held(held, num_held)
    got: list[Any] = []
    first = threading.Event()

    def follow() -> None:
        for event in openai_client(srv.url, timeout=HANG).responses.retrieve(
            created.id, stream=True
        ):
            got.append(event)
            first.set()

    reader = threading.Thread(target=follow)
    reader.start()
    assert first.wait(HANG)  # the events so far came while the run was held
    assert client.responses.retrieve(created.id).status == "in_progress"
    held.release()
    reader.join(HANG)
    assert not reader.is_alive()
    assert [e.sequence_number for e in got] == list(range(len(got)))
    assert got[-1].type == "response.completed"
    done = client.responses.retrieve(created.id)
    assert got[-1].response.output_text == done.output_text != ""


def test_get_of_a_running_response_shows_its_output_so_far(
    client: OpenAI, srv: ServerThread, held: FaultyRunner
) -> None:
    num_held = held.num_held
    body = {**LONG, "max_output_tokens": 12}
    created = client.responses.create(input="Count sheep.", background=True, **body)
    _wait_held(held, num_held)  # two steps ran, the third waits: the run is mid-way
    url = f"{srv.url}/v1/responses/{created.id}?stream=true"
    with urllib.request.urlopen(url, timeout=HANG) as stream:
        seen = ""  # the text the run's events gave so far, up to the first delta
        while not seen:
            line = stream.readline().decode()
            assert line, "the stream ended before any text"
            if line.startswith("data: ") and '"response.output_text.delta"' in line:
                seen = json.loads(line[6:])["delta"]
        now = client.responses.retrieve(created.id)
        assert (now.status, now.background, now.usage) == ("in_progress", True, None)
        (item,) = now.output
        assert (item.type, item.status) == ("message", "in_progress")
        assert now.output_text.startswith(seen)
        held.release()
        rest = stream.read().decode()
    assert '"response.completed"' in rest
    done = client.responses.retrieve(created.id)
    assert done.status == "incomplete" and done.usage is not None
    assert done.usage.output_tokens == 12
    (whole,) = done.output
    assert (whole.id, whole.status) == (item.id, "incomplete")  # the same item, ended
    assert done.output_text.startswith(now.output_text) and done.output_text != now.output_text


def test_refusals(client: OpenAI, srv: ServerThread) -> None:
    foreground = client.responses.create(input="Hi", **GREEDY)
    with pytest.raises(openai.BadRequestError, match="synchronous"):
        client.responses.cancel(foreground.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nothing")
    status, body = _http(f"{srv.url}/v1/responses/{foreground.id}?stream=true")
    assert (status, body["error"]["param"]) == (400, "stream")
    bad = {**GREEDY, "input": "Hi", "background": True, "store": False}
    status, body = _http(f"{srv.url}/v1/responses", "POST", bad)
    assert (status, body["error"]["param"]) == (400, "background")
    status, body = _http(f"{srv.url}/v1/responses/{foreground.id}?stream=true&starting_after=x")
    assert (status, body["error"]["param"]) == (400, "starting_after")


def test_a_server_without_a_store_refuses_background(make_server: Any) -> None:
    srv = make_server(BASE_CONFIG)
    status, body = _http(
        f"{srv.url}/v1/responses", "POST", {**GREEDY, "input": "Hi", "background": True}
    )
    assert (status, body["error"]["param"]) == (400, "background")
    assert "--max-stored-responses" in body["error"]["message"]


def test_shutdown_aborts_a_running_background_response() -> None:
    runner = FaultyRunner(FakeRunner.from_config(BASE_CONFIG))
    srv = ServerThread(BASE_CONFIG, SETTINGS, runner=runner).start()
    try:
        ends = Ends(srv)
        runner.hold_after(2)
        created = openai_client(srv.url).responses.create(
            input="Tell a long story.", background=True, **LONG
        )
        assert runner.wait_until_held(HANG)
        assert len(srv.gateway.background) == 1
        srv.begin_shutdown()
        _until(lambda: len(srv.gateway.background) == 0)  # cancelled by the app's shutdown
        assert srv.gateway.responses.get(created.id) is not None
        stored = json.loads(srv.gateway.responses.get(created.id).response)
        assert stored["status"] == "cancelled"
        runner.release()
        srv.join()
        (end,) = ends.of(created.id)
        assert isinstance(end, Aborted), end
    finally:
        runner.release()
        if srv._thread.is_alive():
            srv.shutdown()


def test_running_ones_are_bounded_and_a_streamed_create_follows() -> None:
    runner = FaultyRunner(FakeRunner.from_config(BASE_CONFIG))
    one = GatewaySettings(engine_process=False, max_stored_responses=1)
    srv = ServerThread(BASE_CONFIG, one, runner=runner).start()
    try:
        client = openai_client(srv.url)
        runner.hold_after(2)
        created = client.responses.create(input="Tell a long story.", background=True, **LONG)
        assert runner.wait_until_held(HANG)
        body = {**GREEDY, "input": "Hi", "background": True}
        status, refused = _http(f"{srv.url}/v1/responses", "POST", body)
        assert (status, refused["error"]["param"]) == (429, "background")
        assert client.responses.cancel(created.id).status == "cancelled"
        runner.release()
        # room again; with stream the create call follows the run to its end
        status, events = _http(f"{srv.url}/v1/responses", "POST", {**body, "stream": True})
        assert status == 200 and events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.completed"
        response_id = events[-1]["response"]["id"]
        assert _http(f"{srv.url}/v1/responses/{response_id}")[1] == events[-1]["response"]
        assert srv.gateway.responses.get(created.id) is None  # evicted once it ended
    finally:
        runner.release()
        srv.shutdown()


def test_a_grammar_dead_end_fails_naming_the_clients_field(client: OpenAI) -> None:
    """As the foreground answer's 400: the error names `text.format.schema`, not the engine's
    `structured_outputs`, in the stored object and in the run's last event."""
    from tests.gateway.test_grammar_dead_end_http import DEAD_SCHEMA

    fmt: Any = {"type": "json_schema", "name": "x", "schema": DEAD_SCHEMA}
    created = client.responses.create(input="Say:", background=True, text={"format": fmt}, **GREEDY)
    events = list(client.responses.retrieve(created.id, stream=True))
    done = client.responses.retrieve(created.id)
    assert done.status == "failed" and done.error is not None
    assert done.error.code == "grammar_dead_end"
    assert done.error.message.startswith("invalid 'text.format.schema': "), done.error
    last = events[-1]
    assert last.type == "error" and last.param == "text.format.schema"
