"""Anthropic's /v1/messages through the router: whole and streamed answers as the replica gives
them (the `anthropic` client's stream helper ends on them), count_tokens, `x-api-key` passed
on to a keyed replica, a conversation keyed on `system` and `messages` staying on one replica,
a replica dying mid-stream failed with Anthropic's `error` event, and the router's own errors
in Anthropic's shape on these paths."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from aiohttp import web
from anthropic import Anthropic
from troupe.gateway.router_keys import anthropic_text, messages_text
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.router_streams import ANTHROPIC_EVENTS
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread
from tests.gateway.router_harness import LoopThread, RouterThread

SYSTEM = (
    "You are a careful assistant for a shipping company. Answer in one short sentence, cite "
    "the tariff table when a price is asked, and never invent tracking numbers."
)
ARGS: dict[str, Any] = {"model": "", "max_tokens": 6, "extra_body": {"temperature": 0}}


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


def _client(url: str, key: str = "unused") -> Anthropic:
    return Anthropic(base_url=url, api_key=key, max_retries=0, timeout=30)


def test_whole_streamed_and_counted_pass_through(replicas, make_router) -> None:  # type: ignore[no-untyped-def]
    router = make_router([replicas[0].url])
    via, direct = _client(router.url), _client(replicas[0].url)
    kw = {"system": SYSTEM, "messages": [{"role": "user", "content": "A 3 kg parcel?"}], **ARGS}
    expected = direct.messages.create(**kw)
    whole = via.messages.create(**kw)
    assert whole.content == expected.content and whole.usage.output_tokens == 6
    events = list(via.messages.create(stream=True, **kw))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    with via.messages.stream(**kw) as stream:  # the client's helper ends on the same events
        assert stream.get_final_message().content[0].text == expected.content[0].text  # type: ignore[union-attr]
    counted = via.messages.count_tokens(model="", system=SYSTEM, messages=kw["messages"])
    assert (
        counted.input_tokens
        == direct.messages.count_tokens(
            model="", system=SYSTEM, messages=kw["messages"]
        ).input_tokens
    )
    (stats,) = router.stats()
    assert stats["failures"] == 0 and stats["routed"] == 4


def test_x_api_key_reaches_a_keyed_replica(replicas, make_router) -> None:  # type: ignore[no-untyped-def]
    keyed = replicas[0].add_gateway(GatewaySettings(api_key="sesame"))
    router = make_router([keyed])
    hi: Any = [{"role": "user", "content": "Hi"}]
    assert _client(router.url, "sesame").messages.create(messages=hi, **ARGS).content
    with pytest.raises(anthropic.AuthenticationError) as caught:
        _client(router.url, "wrong").messages.create(messages=hi, **ARGS)
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_a_conversation_stays_on_its_replica(replicas, make_router) -> None:  # type: ignore[no-untyped-def]
    router = make_router([r.url for r in replicas])
    client = _client(router.url)
    turns: list[Any] = [{"role": "user", "content": "How much is a 3 kg parcel?"}]
    for k in range(4):  # each turn sends the whole conversation again
        out = client.messages.create(system=SYSTEM, messages=turns, **ARGS)
        turns += [{"role": "assistant", "content": out.content[0].text},  # type: ignore[union-attr]
                  {"role": "user", "content": f"And {k + 4} kg?"}]  # fmt: skip
    stats = router.stats()
    assert sorted(s["routed"] for s in stats) == [0, 4]
    assert sum(s["hits"] for s in stats) == 3  # the first turn had no prefix to follow
    # keyed as chat's conversation: `system` a system message first
    chat = {"messages": [{"role": "system", "content": SYSTEM}, *turns]}
    assert anthropic_text({"system": SYSTEM, "messages": turns}) == messages_text(chat)
    blocks = [{"type": "text", "text": SYSTEM}]
    assert anthropic_text({"system": blocks, "messages": turns}) == messages_text(chat)


def _dying_replica() -> web.Application:
    """A stand-in replica whose /v1/messages stream sends two events, then dies."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def messages(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 3, "output_tokens": 0}}  # fmt: skip
        block = {"type": "text", "text": ""}
        for event in (
            {"type": "message_start", "message": message},
            {"type": "content_block_start", "index": 0, "content_block": block},
        ):
            await resp.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        assert request.transport is not None
        request.transport.abort()  # no chunk terminator, no last event
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/messages", messages)
    return app


def test_a_replica_dying_mid_stream_ends_it_with_an_error_event(make_router) -> None:  # type: ignore[no-untyped-def]
    stand_in = LoopThread()
    try:
        router = make_router([stand_in.add_app(_dying_replica())])
        client = _client(router.url)
        hi: Any = [{"role": "user", "content": "hi"}]
        events = []
        with pytest.raises(anthropic.APIStatusError) as caught:  # the SDK raises `error` events
            for event in client.messages.create(model="m", max_tokens=4, messages=hi, stream=True):
                events.append(event.type)
        assert events == ["message_start", "content_block_start"]
        assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]
        (stats,) = router.stats()
        assert stats["failures"] == 1 and stats["up"] is False
        # nothing up now: the router's own 503, in Anthropic's shape
        with pytest.raises(anthropic.APIStatusError) as down:
            client.messages.create(model="m", max_tokens=4, messages=hi)
        assert down.value.status_code == 503
        assert down.value.body["type"] == "error"  # type: ignore[index]
        assert down.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    finally:
        stand_in.close()


def test_the_stream_ends_on_message_stop_or_error() -> None:
    assert ANTHROPIC_EVENTS.is_end(b'event: message_stop\ndata: {"type": "message_stop"}')
    assert ANTHROPIC_EVENTS.is_end(b'data: {"type": "error", "error": {}}')  # `event:` optional
    assert not ANTHROPIC_EVENTS.is_end(b'event: message_delta\ndata: {"type": "message_delta"}')
