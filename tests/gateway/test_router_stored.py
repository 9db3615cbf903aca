"""Stored responses through the router: each lives on the replica that made it, and the router
sends what must meet it there (a turn continuing it, GET, input_items, DELETE) whatever the
prefix policy would choose; an id no replica's home is in is the router's 404, one whose
replica is down a 503 naming it, and an unknown previous_response_id the replica's 400."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread, openai_client
from tests.gateway.router_harness import RouterThread

GREEDY: dict[str, Any] = {"model": "", "temperature": 0, "max_output_tokens": 6}


@pytest.fixture
def replicas() -> Iterator[list[ServerThread]]:
    settings = GatewaySettings(engine_process=False, max_stored_responses=16)
    started = [
        ServerThread(BASE_CONFIG, settings, runner=FakeRunner.from_config(BASE_CONFIG)).start()
        for _ in range(2)
    ]
    yield started
    for srv in started:
        srv.shutdown()


@pytest.fixture
def router(replicas: list[ServerThread]) -> Iterator[RouterThread]:
    urls = tuple(r.url for r in replicas)
    settings = RouterSettings(backend_urls=urls, health_check_interval_s=3600.0)
    started = RouterThread().start_router(settings)
    yield started
    started.close()


def _get(url: str, method: str = "GET") -> tuple[int, dict[str, Any], str | None]:
    """(status, JSON body, the replica that answered) of a body-less request."""
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), resp.headers.get("X-Troupe-Replica")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers.get("X-Troupe-Replica")


def _holder(replicas: list[ServerThread], response_id: str) -> int:
    (index,) = [i for i, r in enumerate(replicas) if r.gateway.responses.get(response_id)]
    return index


def test_every_turn_and_read_goes_to_the_replica_storing_it(
    replicas: list[ServerThread], router: RouterThread
) -> None:
    client = openai_client(router.url)
    first = client.responses.create(input="How much is a 3 kg parcel to Oslo?", **GREEDY)
    home = _holder(replicas, first.id)
    # unrelated text: the policy alone would spread it to the other (emptier) replica
    turn = first
    for k in range(3):
        turn = client.responses.create(
            input=f"Something else entirely, number {k}", previous_response_id=turn.id, **GREEDY
        )
        assert _holder(replicas, turn.id) == home
    elsewhere = client.responses.create(input="A new topic: the weather in Lima", **GREEDY)
    other = _holder(replicas, elsewhere.id)
    assert other != home  # the policy does use the other replica
    # reads, from both replicas, through the router
    for response_id, index in [(turn.id, home), (elsewhere.id, other)]:
        status, body, replica = _get(f"{router.url}/v1/responses/{response_id}")
        assert (status, body["id"], replica) == (200, response_id, str(index))
    items = list(client.responses.input_items.list(turn.id, limit=2, order="asc"))
    assert len(items) == 4 * 2 - 1  # four inputs, three outputs before the last input
    client.responses.delete(elsewhere.id)
    status, body, _ = _get(f"{router.url}/v1/responses/{elsewhere.id}")
    assert status == 404 and body["error"]["code"] == "response_not_found"
    stats = router.stats()
    assert stats[home]["routed"] >= 6 and all(s["failures"] == 0 for s in stats)


def test_unknown_homes_and_a_replica_that_is_down(
    replicas: list[ServerThread], router: RouterThread
) -> None:
    client = openai_client(router.url)
    status, body, _ = _get(f"{router.url}/v1/responses/resp_000000000000abc")
    assert (status, body["error"]["param"]) == (404, "response_id")
    with pytest.raises(openai.BadRequestError) as caught:  # a replica answers for it
        client.responses.create(input="Hi", previous_response_id="resp_nope", **GREEDY)
    assert caught.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
    made = client.responses.create(input="Keep this on one replica", **GREEDY)
    home = _holder(replicas, made.id)
    replicas[home].shutdown()
    status, body, _ = _get(f"{router.url}/v1/responses/{made.id}")
    assert status == 503 and body["error"]["code"] == "replica_unavailable"
    assert replicas[home].url in body["error"]["message"]
    with pytest.raises(openai.InternalServerError) as down:  # not sent to the other replica
        client.responses.create(input="Go on", previous_response_id=made.id, **GREEDY)
    assert down.value.status_code == 503
    assert replicas[1 - home].gateway.responses.statistics().num_entries == 0


def test_a_restarted_home_is_not_found(router: RouterThread) -> None:
    client: OpenAI = openai_client(router.url)
    made = client.responses.create(input="Hello", **GREEDY)
    assert router.replicas is not None
    for replica in router.replicas.replicas:  # as a health check after restarts would see
        replica.home_id = "f" * 12
    status, body, _ = _get(f"{router.url}/v1/responses/{made.id}")
    assert status == 404 and made.id in body["error"]["message"]
