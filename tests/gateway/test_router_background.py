"""Background responses through the router: the create goes the policy's way, and retrieve,
its event stream and cancel go to the replica running it (its home id is in the response id).
The replicas' runners hold steps, so the response is certainly running when it is cancelled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from troupe.gateway.router_settings import RouterSettings
from troupe.gateway.state import GatewaySettings
from troupe.gpu.fake_runner import FakeRunner
from troupe.gpu.faulty_runner import FaultyRunner

from tests.gateway.conftest import BASE_CONFIG, ServerThread, openai_client
from tests.gateway.router_harness import RouterThread

HANG = 60  # s: a hang detector only
LONG: dict[str, Any] = {"model": "", "max_output_tokens": 200, "extra_body": {"ignore_eos": True}}


@pytest.fixture
def replicas() -> Iterator[list[ServerThread]]:
    settings = GatewaySettings(engine_process=False, max_stored_responses=4)
    runners = [FaultyRunner(FakeRunner.from_config(BASE_CONFIG)) for _ in range(2)]
    started = [ServerThread(BASE_CONFIG, settings, runner=r).start() for r in runners]
    yield started
    for srv, runner in zip(started, runners, strict=True):
        runner.release()
        srv.shutdown()


@pytest.fixture
def router(replicas: list[ServerThread]) -> Iterator[RouterThread]:
    urls = tuple(r.url for r in replicas)
    settings = RouterSettings(backend_urls=urls, health_check_interval_s=3600.0)
    started = RouterThread().start_router(settings)
    yield started
    started.close()


def test_cancel_and_reads_reach_the_replica_running_it(
    replicas: list[ServerThread], router: RouterThread
) -> None:
    for srv in replicas:
        srv.runner.hold_after(2)
    client = openai_client(router.url)
    created = client.responses.create(input="Tell a long story.", background=True, **LONG)
    (home,) = [i for i, r in enumerate(replicas) if r.gateway.background.get(created.id)]
    assert replicas[home].runner.wait_until_held(HANG)
    assert client.responses.retrieve(created.id).status == "in_progress"
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert len(replicas[home].gateway.background) == 0
    events = list(client.responses.retrieve(created.id, stream=True))  # piped whole
    assert events[0].type == "response.created" and events[-1].type == "error"
    for srv in replicas:
        srv.runner.release()
    replicas[home].wait_idle(HANG)  # the request ended there, its blocks back
    stats = router.stats()
    assert all(s["failures"] == 0 for s in stats), stats
