"""POST /v1/responses through the router: whole and streamed answers as the replica gives them,
a stream that ends with response.completed (no [DONE]) or a replica's own `error` event taken as
ended, a replica dying mid-stream failed with one `error` event, and conversations keyed on
`instructions` and `input` staying on one replica. The SSE framing itself: router_streams."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from openai import OpenAI
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.router_streams import DONE_SENTINEL, RESPONSES_EVENTS, LastEvent
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.router_harness import LoopThread, RouterThread

GREEDY: dict[str, Any] = {"model": "", "temperature": 0, "max_output_tokens": 6}
INSTRUCTIONS = (
    "You are a careful assistant for a shipping company. Answer in one short sentence, cite "
    "the tariff table when a price is asked, and never invent tracking numbers."
)


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[ServerThread]]:
    started = []
    for _ in range(2):
        runner = FakeRunner.from_config(BASE_CONFIG)
        settings = GatewaySettings(engine_process=False)
        started.append(ServerThread(BASE_CONFIG, settings, runner=runner).start())
    yield started
    for srv in started:
        srv.shutdown()


@pytest.fixture
def make_router() -> Iterator[Any]:
    routers: list[RouterThread] = []

    def make(urls: list[str]) -> RouterThread:
        settings = RouterSettings(backend_urls=tuple(urls), health_check_interval_s=3600.0)
        routers.append(RouterThread().start_router(settings))
        return routers[-1]

    yield make
    for router in routers:
        router.close()


def _client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def _sse(url: str, body: object) -> list[tuple[str | None, dict[str, Any]]]:
    """POST `body` to /v1/responses; the stream's (event name, data) pairs."""
    req = urllib.request.Request(
        f"{url}/v1/responses", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read().decode()
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            out.append((lines.get("event"), json.loads(lines["data"])))
    return out


def test_whole_and_streamed_answers_pass_through(replicas, make_router) -> None:  # type: ignore[no-untyped-def]
    router = make_router([replicas[0].url])
    via, direct = _client(router.url), _client(replicas[0].url)
    kw = {"instructions": INSTRUCTIONS, "input": "How much is a 3 kg parcel?", **GREEDY}
    expected = direct.responses.create(**kw)
    whole = via.responses.create(**kw)
    assert whole.output_text == expected.output_text and whole.status == expected.status
    events = list(via.responses.create(stream=True, **kw))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == expected.output_text
    with via.responses.stream(**kw) as stream:  # the client's helper ends on the same events
        assert stream.get_final_response().output_text == expected.output_text
    (stats,) = router.stats()
    assert stats["failures"] == 0 and stats["up"] is True and stats["routed"] == 3


def test_a_conversation_stays_on_its_replica(replicas, make_router) -> None:  # type: ignore[no-untyped-def]
    router = make_router([r.url for r in replicas])
    client = _client(router.url)
    turns: list[Any] = [{"role": "user", "content": "How much is a 3 kg parcel?"}]
    for k in range(4):  # each turn sends the whole conversation again
        out = client.responses.create(instructions=INSTRUCTIONS, input=turns, **GREEDY)
        turns += [{"role": "assistant", "content": out.output_text},
                  {"role": "user", "content": f"And {k + 4} kg?"}]  # fmt: skip
    stats = router.stats()
    assert sorted(s["routed"] for s in stats) == [0, 4]
    assert sum(s["hits"] for s in stats) == 3  # the first turn had no prefix to follow


def _responses_replica(ending: str) -> web.Application:
    """A stand-in replica whose /v1/responses stream sends three events, then `ending`."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def responses(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = [
            {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
            {"type": "response.output_text.delta", "item_id": "m", "delta": "Hel"},
            {"type": "response.output_text.delta", "item_id": "m", "delta": "lo"},
        ]
        if ending == "error_event":  # the replica's own failure: it ended the stream
            events.append({"type": "error", "code": "slow_consumer", "message": "too slow"})
        for number, event in enumerate(events):
            data = json.dumps({**event, "sequence_number": number})
            await resp.write(f"event: {event['type']}\ndata: {data}\n\n".encode())
        if ending == "reset":
            assert request.transport is not None
            request.transport.abort()  # the replica dies: no chunk terminator, no last event
        else:
            await resp.write_eof()  # eof: a clean close, but the answer never completed
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/responses", responses)
    return app


@pytest.mark.parametrize("ending", ["reset", "eof", "error_event"])
def test_a_stream_that_stops_before_its_end_fails_the_replica(make_router, ending: str) -> None:  # type: ignore[no-untyped-def]
    stand_in = LoopThread()
    try:
        router = make_router([stand_in.add_app(_responses_replica(ending))])
        events = _sse(router.url, {"model": "m", "input": "hi", "stream": True})
        names = [name for name, _ in events]
        assert names[:3] == ["response.created", *["response.output_text.delta"] * 2]
        assert names[3:] == ["error"], names  # one error event ends it, however it stopped
        last = events[-1][1]
        assert last["sequence_number"] == 3 and last["type"] == "error"
        (stats,) = router.stats()
        if ending == "error_event":  # passed through as the replica sent it
            assert last["code"] == "slow_consumer"
            assert stats["failures"] == 0 and stats["up"] is True
            return
        assert last["code"] == "replica_failed"
        assert "mid-stream" in last["message"] or "before its end" in last["message"]
        assert stats["failures"] == 1 and stats["up"] is False
        fresh = make_router([stats["url"]])  # up again there: the openai client's view
        out = list(_client(fresh.url).responses.create(model="m", input="hi", stream=True))
        assert out[-1].type == "error" and out[-1].code == "replica_failed"
        assert [e.sequence_number for e in out] == [0, 1, 2, 3]
    finally:
        stand_in.close()


def test_last_event_reads_events_split_anywhere() -> None:
    stream = (
        b'event: response.created\ndata: {"type": "response.created", "sequence_number": 0}\n\n'
        b'event: response.completed\ndata: {"type": "response.completed", '
        b'"sequence_number": 1}\n\n'
    )
    for cut in range(len(stream) + 1):
        last = LastEvent()
        last.feed(stream[:cut])
        last.feed(stream[cut:])
        assert last.is_complete and RESPONSES_EVENTS.is_end(last.event), cut
        assert not DONE_SENTINEL.is_end(last.event)
    cut_short = LastEvent()
    cut_short.feed(stream[:-1])  # the last event's blank line never came
    assert not cut_short.is_complete and not RESPONSES_EVENTS.is_end(cut_short.event)
    nameless = b'data: {"type": "error", "sequence_number": 4}'  # `event:` is optional in SSE
    assert RESPONSES_EVENTS.is_end(nameless)
    assert not RESPONSES_EVENTS.is_end(b'event: response.output_text.delta\ndata: {"type": "x"}')
    assert DONE_SENTINEL.is_end(b"data: [DONE]") and not DONE_SENTINEL.is_end(b"data: {}")
